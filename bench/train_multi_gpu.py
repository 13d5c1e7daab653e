"""Training on 1 GPU against 2 GPUs (torchrun --nproc-per-node 2), both through specops' launch path,
and the resume of a 2-GPU run after one of its ranks is killed.

Both runs are `job launch` of `python -m specops step train --run bench --gpus G --fresh` (what
`invoke train --gpus G` starts on a host): `step train` builds `speculators train` for one GPU and
`torchrun --standalone --nproc_per_node=2 -m speculators.train` for two. Same draft as the training
bench: Llama-3.1-8B dimensions, 1 draft layer, draft vocab 32k, ttt 3, 8192 tokens per step and rank,
speculators' default optimizer (Muon) unless --optimizer says otherwise. Tokens/s counts every rank's
batch: steps/s (wall clock between logged steps, see trainbench.py) x tokens per step x ranks.
Scaling efficiency = 2-GPU tokens/s / (2 x 1-GPU tokens/s); the issue asks >= 0.9.

Resume (--resume): a 2-GPU run checkpoints every quarter epoch; once the first mid-epoch checkpoint
is complete, rank 1 is killed (SIGKILL). torchrun must then stop the whole group (the job ends
failed, rank 0 gone too), and a relaunch without --fresh must resume from that checkpoint (its first
logged step is past it) and finish the epoch.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1, as the device documentation requires): set here if the environment lacks
them, and passed to the job, whose trainer inherits the launching environment.

    source bench/device_setup.sh && python3 bench/train_multi_gpu.py --resume     # >= 2 GPUs
On a host with one GPU it measures the 1-GPU baseline and says what it could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import trainbench as tb

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TTT = 3


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny dimensions (smoke test)")
    parser.add_argument("--optimizer", default="muon", choices=["muon", "adamw"])
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per step and rank")
    parser.add_argument("--steps", type=int, default=61)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--gpus", type=int, default=None, help="GPUs for the wide run (default: 2 if visible)")
    parser.add_argument("--resume", action="store_true", help="also kill one rank mid-epoch and resume")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args()


def visible_gpus() -> int:
    from specops.host.gpus import device_count as count

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return min(count(), len([d for d in visible.split(",") if d])) if visible is not None else count()


def throughput(result: tb.SideResult, warmup: int, ranks: int) -> dict:
    steps_per_s, first, last = tb.window_rate(result, warmup)
    tokens = tb.tokens_per_step(result.log)
    return {"tokens_per_s": steps_per_s * tokens * ranks, "step_ms": 1000 / steps_per_s, "ranks": ranks,
            "tokens_per_step_and_rank": tokens, "window": [first, last], "wall_s": result.wall_s,
            "log": str(result.log)}


def rank_pids(rank: int, ranks: int) -> list[int]:
    """Trainer processes of the given LOCAL_RANK (torchrun's workers), read from /proc; with one
    rank (no torchrun, a smoke run) the `speculators train` process itself."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        line = b" ".join(cmdline)
        if ranks == 1:
            if cmdline[0].endswith(b"speculators") or b"speculators train" in line:
                found.append(int(entry.name))
        elif b"speculators.train" in line and f"LOCAL_RANK={rank}".encode() in environ and b"torchrun" not in line:
            found.append(int(entry.name))
    return found


def resume_scenario(env: dict[str, str], workdir: Path, verifier: Path, shape: tb.Shape, gpus: int,
                    optimizer: str, tokens: int, asked: int) -> dict:
    from specops.jobs import records
    from specops.pipeline.training import command as train
    from specops.pipeline.training import metrics

    variant = tb.Variant(optimizer, tokens, steps=10**6, extra=("--checkpoint-freq", "0.25"))
    tb.write_run_config(workdir, verifier, shape, variant)
    checkpoints = workdir / "runs" / tb.RUN / "checkpoints"
    os.environ["SPECOPS_WORKDIR"] = env["SPECOPS_WORKDIR"]
    launched = tb.agent(env, "job", "launch", "--name", "train", "--run", tb.RUN, "--", sys.executable, "-m",
                        "specops", "step", "train", "--run", tb.RUN, "--gpus", str(asked), "--fresh")["job"]
    deadline = time.monotonic() + 900
    state = train.checkpoint_state(checkpoints)
    while not state.mid_epoch_step and time.monotonic() < deadline:
        if records.load(launched["id"])["state"] not in ("pending", "running"):
            sys.exit(f"resume: the first run ended before a mid-epoch checkpoint; see {launched['log']}")
        time.sleep(0.5)
        state = train.checkpoint_state(checkpoints)
    if not state.mid_epoch_step:
        sys.exit("resume: no mid-epoch checkpoint within 15 minutes")
    victims = rank_pids(gpus - 1, gpus)
    if not victims:
        sys.exit("resume: found no trainer process of the last rank to kill")
    killed_at = time.monotonic()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    while records.load(launched["id"])["state"] in ("pending", "running") and time.monotonic() < killed_at + 300:
        time.sleep(0.5)
    first = records.load(launched["id"])
    survivors = rank_pids(0, gpus)
    stopped_s = time.monotonic() - killed_at
    checkpoint = train.checkpoint_state(checkpoints)
    relaunch = tb.run_job(env, ["step", "train", "--run", tb.RUN, "--gpus", str(asked)])
    log = metrics.read_log(checkpoints / train.LOG_FILE)
    resumed_steps = [step.global_step for step in log.steps if step.launch == log.launches]
    final = train.checkpoint_state(checkpoints)
    outcome = {
        "killed_rank": gpus - 1, "killed_pids": victims, "checkpoint_before_kill": checkpoint.as_dict(),
        "first_run_state": first["state"], "first_run_exit_code": first.get("exit_code"),
        "group_stopped_s": round(stopped_s, 1), "rank0_left_running": survivors,
        "relaunch_exit_code": relaunch.exit_code, "relaunch_first_logged_step": min(resumed_steps, default=None),
        "final_checkpoint": final.as_dict(),
    }
    outcome["ok"] = (first["state"] == "failed" and not survivors and relaunch.exit_code == 0
                     and checkpoint.global_step is not None and resumed_steps
                     and min(resumed_steps) >= checkpoint.global_step and final.newest_epoch == 0
                     and not final.mid_epoch_step)
    return outcome


def main() -> None:
    args = parse_args()
    shape = tb.TINY if args.tiny else tb.EIGHT_B
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="bench-multi-"))).resolve()
    for name, value in NO_MULTICAST.items():
        os.environ.setdefault(name, value)
        if os.environ[name] != value:
            sys.exit(f"{name}={os.environ[name]}: NVLink multicast must stay off ({name}={value})")
    env = tb.bench_env(workdir)
    visible = visible_gpus()
    wide = args.gpus or 2
    per_step = max(args.tokens // shape.seq_len, 1)
    # the resume run needs a real epoch: ~200 steps of `wide` ranks, checkpointed every quarter
    rows = max(int(args.steps * per_step / 0.95), 200 * per_step * wide if args.resume else 0) + 16
    print(f"inputs in {workdir}; {visible} GPU(s) visible", file=sys.stderr)
    verifier = tb.make_run_inputs(shape, rows, workdir)
    variant = tb.Variant(args.optimizer, args.tokens, args.steps)
    tb.write_run_config(workdir, verifier, shape, variant)
    figures: dict = {"optimizer": args.optimizer, "tokens_per_step_and_rank": args.tokens,
                     "visible_gpus": visible, "env": {name: env[name] for name in NO_MULTICAST}}
    gpu_counts = [1, wide] if visible >= wide and wide > 1 else [1]
    for gpus in gpu_counts:
        asked = gpus if visible else 0  # a CPU smoke run (--tiny) trains on the CPU
        result = tb.run_job(env, ["step", "train", "--run", tb.RUN, "--gpus", str(asked), "--fresh"])
        if result.exit_code != 0:
            tail = "\n".join(result.log.read_text(errors="replace").splitlines()[-40:])
            sys.exit(f"{tail}\n{gpus} GPU(s): training failed; see {result.log}")
        figures[f"{gpus}_gpu"] = throughput(result, args.warmup, gpus)
        row = figures[f"{gpus}_gpu"]
        print(f"{gpus} GPU(s): {row['tokens_per_s']:10.0f} tokens/s, step {row['step_ms']:.1f} ms, "
              f"wall {row['wall_s']:.0f} s", file=sys.stderr)
    if args.resume and (visible >= wide or (args.tiny and wide == 1)):
        figures["resume"] = resume_scenario(env, workdir, verifier, shape, wide, args.optimizer, args.tokens,
                                            wide if visible else 0)

    one = figures["1_gpu"]
    limit = tb.step_limit(shape, variant, TTT)
    print(f"\nsetting: hidden {shape.hidden}, vocab {shape.vocab}, draft vocab {shape.draft_vocab}, 1 draft layer, "
          f"ttt {TTT}, {args.tokens} tokens per step and rank, optimizer {args.optimizer}; through job launch "
          f"of `step train --gpus G`; " + ", ".join(f"{k}={v}" for k, v in figures["env"].items()))
    print(f"{'GPUs':>5} {'tokens/s':>10} {'step ms':>8} {'x 1 GPU':>8} {'efficiency':>10}")
    print(f"{1:>5} {one['tokens_per_s']:10.0f} {one['step_ms']:8.1f} {1.0:8.2f} {1.0:10.3f}   "
          f"(compute limit {limit.ms:.1f} ms per step and GPU)")
    if wide > 1 and f"{wide}_gpu" in figures:
        row = figures[f"{wide}_gpu"]
        speedup = row["tokens_per_s"] / one["tokens_per_s"]
        figures["scaling_efficiency"] = speedup / wide
        print(f"{wide:>5} {row['tokens_per_s']:10.0f} {row['step_ms']:8.1f} {speedup:8.2f} {speedup / wide:10.3f}")
    elif wide > 1:
        print(f"{wide:>5} not run: {visible} GPU(s) visible (needs {wide}); the 1-GPU row is the baseline")
    if "resume" in figures:
        outcome = figures["resume"]
        print(f"resume: killed rank {outcome['killed_rank']} after the checkpoint at global step "
              f"{outcome['checkpoint_before_kill']['global_step']}; first run {outcome['first_run_state']} "
              f"(exit {outcome['first_run_exit_code']}) {outcome['group_stopped_s']} s later, rank 0 left: "
              f"{outcome['rank0_left_running'] or 'none'}; relaunch exit {outcome['relaunch_exit_code']}, first "
              f"logged step {outcome['relaunch_first_logged_step']} -> {'OK' if outcome['ok'] else 'FAILED'}")
    elif args.resume:
        print(f"resume: not run ({visible} GPU(s) visible, needs {wide})")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
