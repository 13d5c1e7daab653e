"""Issue 53: one training command twice on one GPU, the compile caches cold then warm: the same draft?

    source bench/device_setup.sh
    python3 bench/train_caches.py --workdir /tmp/tc --out $OUT/tc [--arms as-before pinned] [--steps 60]

Synthetic run inputs at gpu-kimi's draft dimensions (bench/trainbench.make_run_inputs: hidden 2048, a
target vocabulary of 163,840, a draft vocabulary of 32,000, 8192 tokens a step in documents of 512, AdamW),
the argv `step train --dry-run` prints and the environment the train step gives its trainer
(training/command.train_environment). Per arm, the same training twice, one after the other, with the
same Triton and Inductor cache folders, empty before the first: cold, then warm (a user's second run of
the same command meets the caches the first left). Arms (what each sets over train_environment):
  as-before   TORCHINDUCTOR_DETERMINISTIC=0: the environment before issue 53 (the fused loss's tile fixed,
              Inductor's reduction configs chosen by timing on a cold cache, read back from a warm one)
  pinned      nothing: the train step's own environment (training.command.PINNED)
  pgo-off     as-before with Dynamo's automatic-dynamic profile off (TORCH_DYNAMO_AUTOMATIC_DYNAMIC_LOCAL_PGO=0)
  no-tile     pinned with the fused loss's tile autotuned again (SPECOPS_FIXED_LOSS_TILE=0)
Per side: sha256 of the final checkpoint's model.safetensors and optimizer state, the logged losses (the
first step where cold and warm differ), steps/s between logged steps from --warmup on (the wall clock,
bench/trainbench.py), wall seconds, and what the cache folders hold after it (Inductor's .best_config
files: kernels whose config was chosen by timing; their digest shows whether the warm side timed again).
Writes OUT/train_caches.json and prints a table. Asserts nothing.

On a CPU (no torch.compile: speculators compiles only on CUDA), `--shape tiny --steps 4` runs the plumbing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import trainbench as tb
from acceptance_spread import first_difference, losses

# gpu-kimi's draft: the Kimi-K2.5-shaped target's text dimensions (specops.pipeline.data.tiny_kimi, "gpu"),
# its vocabulary, runs/gpu-kimi.yaml's draft vocabulary and max_seq_len
SHAPES = {
    "kimi": tb.Shape(hidden=2048, intermediate=8192, layers=8, heads=16, kv_heads=16, vocab=163_840,
                     draft_vocab=32_000, seq_len=512),
    "tiny": tb.TINY,
}
ARMS = {
    "as-before": {"TORCHINDUCTOR_DETERMINISTIC": "0"},
    "pinned": {},
    "pgo-off": {"TORCHINDUCTOR_DETERMINISTIC": "0", "TORCH_DYNAMO_AUTOMATIC_DYNAMIC_LOCAL_PGO": "0"},
    "no-tile": {"SPECOPS_FIXED_LOSS_TILE": "0"},
}


def digest(path: Path) -> str | None:
    if not path.is_file():
        return None
    sha = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(1 << 24):
            sha.update(block)
    return sha.hexdigest()[:16]


def final_checkpoint(save: Path) -> Path | None:
    numbered = sorted((entry for entry in save.iterdir() if entry.is_dir() and entry.name.isdigit()),
                      key=lambda entry: int(entry.name)) if save.is_dir() else []
    return numbered[-1] if numbered else None


def cache_inventory(caches: Path) -> dict:
    """Files in the cache folders by kind; the timed choices (.best_config) and a digest of their contents."""
    files = [path for path in caches.rglob("*") if path.is_file()]
    chosen = sorted(path for path in files if path.suffix == ".best_config")
    sha = hashlib.sha256()
    for path in chosen:
        sha.update(path.name.encode() + b"\0" + path.read_bytes())
    return {"files": len(files), "best_config": len(chosen), "best_config_digest": sha.hexdigest()[:16],
            "dynamo_profiles": sum(1 for path in files if "code_state" in path.name),
            "triton_autotune": sum(1 for path in files if path.name.endswith(".autotune.json")),
            "bytes": sum(path.stat().st_size for path in files)}


def train_side(env: dict[str, str], argv: list[str], save: Path, warmup: int) -> dict:
    shutil.rmtree(save, ignore_errors=True)
    side_argv = list(argv)
    side_argv[side_argv.index("--save-path") + 1] = str(save)
    result = tb.run_direct(env, side_argv, save)
    figures: dict = {"exit": result.exit_code, "wall_s": round(result.wall_s, 1), "log": str(result.log),
                     "first_step_s": round(min(result.stamps.values()), 1) if result.stamps else None}
    steps = sorted(step for step in result.stamps if step >= warmup)
    if len(steps) >= 2:
        rate, first, last = tb.window_rate(result, warmup)
        figures.update(steps_per_s=round(rate, 3), window=[first, last])
    checkpoint = final_checkpoint(save)
    if checkpoint is not None:
        figures.update(checkpoint=checkpoint.name, model=digest(checkpoint / "model.safetensors"),
                       optimizer=digest(checkpoint / "optimizer_state_dict.pt"))
    figures["losses"] = losses(result.log)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--arms", nargs="+", default=["as-before", "pinned"], choices=sorted(ARMS))
    parser.add_argument("--shape", default="kimi", choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--log-freq", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=10, help="steps/s from this logged step on")
    parser.add_argument("--workers", type=int, default=4, help="loader workers (speculators' default is 12)")
    parser.add_argument("--sides", nargs="+", default=["cold", "warm"], help="cold empties the caches first")
    parser.add_argument("--together", action="store_true",
                        help="the arms side by side (every arm's cold side at once, then every warm side): "
                             "half the wall time; steps/s then shared between them")
    parser.add_argument("--reuse-inputs", action="store_true",
                        help="the inputs an earlier call wrote in --workdir (a later call on a warm machine: "
                             "--arms A --sides warm goes on where one call's limit cut it)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    shape = SHAPES[args.shape]
    tokens = 8192 if args.shape == "kimi" else 4 * shape.seq_len  # total_seq_len: runs/gpu-kimi.yaml's
    docs_per_step = tokens // shape.seq_len
    rows = int(args.steps * docs_per_step / 0.95) + 2 * docs_per_step  # --train-data-ratio 0.95
    started = time.perf_counter()
    if not (args.reuse_inputs and (args.workdir / "runs" / f"{tb.RUN}.yaml").is_file()):
        verifier = tb.make_run_inputs(shape, rows, args.workdir)
        tb.write_run_config(args.workdir, verifier, shape,
                            tb.Variant("adamw", tokens, args.steps, log_freq=args.log_freq, workers=args.workers))
    env = tb.bench_env(args.workdir)
    dry = tb.agent(env, "step", "train", "--run", tb.RUN, "--dry-run")
    argv = list(dry["command"])
    sys.path.insert(0, str(tb.REPO / "src"))
    from specops.pipeline.training.command import train_environment

    figures: dict = {"shape": vars(shape), "rows": rows, "argv": argv, "pinned_by_step": dry.get("pinned"),
                     "inputs_s": round(time.perf_counter() - started, 1), "arms": {}}

    def save() -> None:  # after every side: a call cut off at its limit keeps what it measured
        (args.out / "train_caches.json").write_text(json.dumps(figures, indent=1, default=str))

    save()
    envs = {}
    for arm in args.arms:
        caches = args.workdir / f"caches-{arm}"
        envs[arm] = train_environment({**env, **ARMS[arm], "TRITON_CACHE_DIR": str(caches / "triton"),
                                       "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor")})
        shown = ("SPECOPS_FIXED_LOSS_TILE", "TORCHINDUCTOR_DETERMINISTIC", "TORCH_DYNAMO_AUTOMATIC_DYNAMIC_LOCAL_PGO",
                 "TRITON_CACHE_AUTOTUNING")
        figures["arms"][arm] = {"set": ARMS[arm], "environment": {name: envs[arm].get(name) for name in shown}}

    def one_side(arm: str, side: str) -> None:
        caches = args.workdir / f"caches-{arm}"
        if side == "cold":
            shutil.rmtree(caches, ignore_errors=True)
        print(f"train_caches: {arm} {side} ...", file=sys.stderr, flush=True)
        result = train_side(envs[arm], argv, args.workdir / "sides" / f"{arm}-{side}", args.warmup)
        result["caches"] = cache_inventory(caches)
        figures["arms"][arm][side] = result
        print(f"train_caches: {arm} {side} exit {result['exit']} in {result['wall_s']} s, "
              f"{result.get('steps_per_s')} steps/s, model {result.get('model')}, caches {result['caches']}",
              file=sys.stderr, flush=True)
        save()

    if args.together:  # every arm's side at once on the one GPU: each arm's caches are its own
        from concurrent.futures import ThreadPoolExecutor

        figures["together"] = True
        for side in args.sides:
            with ThreadPoolExecutor(max_workers=len(args.arms)) as pool:
                list(pool.map(lambda arm, side=side: one_side(arm, side), args.arms))
    else:
        for arm in args.arms:
            for side in args.sides:
                one_side(arm, side)
    for entry in figures["arms"].values():
        if "cold" in entry and "warm" in entry:
            cold, warm = entry["cold"], entry["warm"]
            entry["same_model"] = bool(cold.get("model")) and cold.get("model") == warm.get("model")
            entry["same_optimizer"] = bool(cold.get("optimizer")) and cold.get("optimizer") == warm.get("optimizer")
            entry["first_loss_difference"] = first_difference(cold["losses"], warm["losses"])
    save()
    print(f"\n{'arm':10s} {'side':5s} {'exit':>4s} {'wall s':>7s} {'steps/s':>8s} {'model':16s} {'best_config':>11s}")
    for arm, entry in figures["arms"].items():
        for side in args.sides:
            if side in entry:
                one = entry[side]
                print(f"{arm:10s} {side:5s} {one['exit']:>4} {one['wall_s']:>7} {one.get('steps_per_s')!s:>8} "
                      f"{one.get('model')!s:16s} {one['caches']['best_config']:>11}")
        if "same_model" in entry:
            print(f"{arm}: cold and warm model {'EQUAL' if entry['same_model'] else 'DIFFER'}, optimizer "
                  f"{'equal' if entry['same_optimizer'] else 'differ'}; first differing logged loss "
                  f"{entry['first_loss_difference']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
