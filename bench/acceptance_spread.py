"""Where the spread of a run's acceptance length comes from: training, evaluation or the data.

    source bench/device_setup.sh
    python3 bench/gpu_pipeline.py --runs gpu-8b --workdir /tmp/gp --out /tmp/o   # a finished run first
    python3 bench/acceptance_spread.py --run gpu-8b --workdir /tmp/gp --out /tmp/o [--copies 2]

On a workdir where the run's pipeline finished (its data, hidden states and vocab on disk), trains the
draft again from the very argv `step train --dry-run` prints, several times side by side on the same
GPU (each into its own save path), in two arms:
  as-is          the argv unchanged (speculators seeds python, numpy and torch with --seed; the packing
                 order is seeded too), `--copies` times
  deterministic  the same argv with torch's deterministic algorithms on (a sitecustomize on the child's
                 path: torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG), `--copies` times
  fresh-cache    the argv unchanged, each side with its own empty Triton and Inductor caches: kernels
                 compiled and autotuned (by timing) again, as on a fresh machine
  fixed-fresh    fresh caches as above, with the fused loss's row tile fixed (SPECOPS_FIXED_LOSS_TILE=1,
                 patch fixed-tile of speculators-0.9.0-fused-loss; what the training step sets)
The other arms run with SPECOPS_FIXED_LOSS_TILE=0: the autotuner as speculators ships it.
then scores every final checkpoint with the pipeline's own scorer (evaluation.Scorer, hf replay, the
run's held-out prompts), the pipeline's checkpoint twice (is the evaluation itself repeatable?), and
compares the logged training losses of each pair step by step (the first step where they differ).
Prints a table and writes OUT/acceptance_spread.json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trainbench as tb  # the agent call as the control side makes it (bench/trainbench.py)

REPO = Path(__file__).resolve().parents[1]
# speculators' rich log wraps one record over several lines: train/loss=X ... global_step=N
LOSS = re.compile(r"\btrain/loss=([0-9.]+(?:e[-+]?\d+)?)")
STEP = re.compile(r"\bglobal_step=(\d+)")
DETERMINISTIC_SITE = """import os
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch
torch.use_deterministic_algorithms(True, warn_only=True)
"""


def train_side_by_side(env: dict[str, str], argv: list[str], sides: dict[str, str], root: Path) -> dict[str, dict]:
    """Every side's training at once (one GPU holds them all at these sizes); {side: {save, log, exit, s}}."""
    from specops.pipeline.training import command as train

    site = Path(tempfile.mkdtemp(prefix="deterministic-site-"))
    (site / "sitecustomize.py").write_text(DETERMINISTIC_SITE)
    processes = {}
    for side, arm in sides.items():
        save = root / side
        save.mkdir(parents=True, exist_ok=True)
        side_argv = list(argv)
        side_argv[side_argv.index("--save-path") + 1] = str(save)
        side_env = dict(env)
        side_env["SPECOPS_FIXED_LOSS_TILE"] = "1" if arm == "fixed-fresh" else "0"
        if arm in ("fresh-cache", "fixed-fresh"):
            for name in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
                side_env[name] = str(save / name.lower())
        if arm == "deterministic":
            side_env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
            side_env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        log = open(save / "train.log", "wb")  # closed once the process ends
        started = time.perf_counter()
        process = subprocess.Popen([train.resolve_executable(side_argv[0]), *side_argv[1:]], stdout=log,
                                   stderr=subprocess.STDOUT, env=side_env, cwd=env["SPECOPS_WORKDIR"])
        processes[side] = (process, log, save, started)
    results = {}
    for side, (process, log, save, started) in processes.items():
        code = process.wait()
        log.close()
        results[side] = {"save": str(save), "log": str(save / "train.log"), "exit": code,
                         "seconds": round(time.perf_counter() - started, 1)}
    return results


def losses(log: Path) -> dict[int, float]:
    """{global step: train/loss} as the log prints them (3 significant digits)."""
    found: dict[int, float] = {}
    loss = None
    for line in log.read_text(errors="replace").splitlines():
        if match := LOSS.search(line):
            loss = float(match.group(1))
        if (step := STEP.search(line)) and loss is not None:
            found.setdefault(int(step.group(1)), loss)
            loss = None
    return found


def first_difference(a: dict[int, float], b: dict[int, float]) -> dict:
    shared = sorted(set(a) & set(b))
    for step in shared:
        if a[step] != b[step]:
            return {"step": step, "a": a[step], "b": b[step], "steps_compared": len(shared)}
    return {"step": None, "steps_compared": len(shared)}


def final_checkpoint(save: Path) -> Path | None:
    from specops.pipeline.evaluation.drafts import epoch_folders

    folders = epoch_folders(save)
    return folders[-1] if folders else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", default="gpu-8b")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--no-pipeline-score", action="store_true", help="skip scoring the pipeline's checkpoint")
    parser.add_argument("--arms", nargs="+", default=["as-is", "deterministic"],
                        choices=["as-is", "deterministic", "fresh-cache", "fixed-fresh"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = [part for part in os.environ.get("PYTHONPATH", "").split(os.pathsep) if part]
    env = {**os.environ, "SPECOPS_WORKDIR": str(args.workdir), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([*path, str(REPO / "src")])}
    os.environ["SPECOPS_WORKDIR"] = str(args.workdir)
    sys.path.insert(0, str(REPO / "src"))
    argv = list(tb.agent(env, "step", "train", "--run", args.run, "--dry-run")["command"])
    sides = {f"{arm}-{i}": arm for arm in args.arms for i in range(args.copies)}
    figures: dict = {"run": args.run, "argv": argv, "sides": {}}

    def save() -> None:
        (args.out / "acceptance_spread.json").write_text(json.dumps(figures, indent=1, default=str))

    print(f"spread: training {len(sides)} drafts side by side: {', '.join(sides)}", file=sys.stderr, flush=True)
    figures["sides"] = train_side_by_side(env, argv, sides, args.workdir / f"spread-{'-'.join(args.arms)}")
    save()
    from specops.pipeline import open_run
    from specops.pipeline.evaluation.prompts import heldout_token_ids
    from specops.pipeline.evaluation.step import Scorer

    run = open_run(args.run)
    scorer = Scorer(run, "hf", heldout_token_ids(run, None))
    pipeline_checkpoint = final_checkpoint(run.paths.checkpoints)
    scored: dict[str, float | None] = {}
    if pipeline_checkpoint is not None and not args.no_pipeline_score:
        for label in ("pipeline", "pipeline-again"):
            scored[label] = scorer.score(pipeline_checkpoint, label)["mean_acceptance_length"]
    for side, result in figures["sides"].items():
        checkpoint = final_checkpoint(Path(result["save"]))
        report = scorer.score(checkpoint, side) if checkpoint else {}
        result["acceptance_length"] = report.get("mean_acceptance_length")
        result["losses"] = losses(Path(result["log"]))
        print(f"spread: {side} acceptance {result['acceptance_length']}", file=sys.stderr, flush=True)
        save()
    figures["pipeline_scored_twice"] = scored
    for arm in args.arms:
        if args.copies >= 2:
            a, b = figures["sides"][f"{arm}-0"], figures["sides"][f"{arm}-1"]
            figures[f"{arm}_first_loss_difference"] = first_difference(a["losses"], b["losses"])
    save()
    print(f"\n{'side':16s} {'acceptance':>10s} {'seconds':>8s} exit")
    for label, value in scored.items():
        print(f"{label:16s} {value!s:>10s}")
    for side, result in figures["sides"].items():
        print(f"{side:16s} {result['acceptance_length']!s:>10s} {result['seconds']!s:>8s} {result['exit']}")
    for arm in args.arms:
        print(f"{arm}: first differing logged loss {figures.get(f'{arm}_first_loss_difference')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
