"""Training throughput: `speculators train` run directly against specops' launch path, per optimizer
and tokens per step, side by side in one run.

Both sides train the same draft on the same synthetic inputs (Llama-3.1-8B dimensions: hidden 4096,
vocab 128256, 32 layers; draft vocab 32k, 1 draft layer, ttt 3; documents of 2048 tokens packed
into `--total-seq-len` tokens per step, 8192 by default like speculators'), with the same argv:
  speculators  the console script with the arguments `step train --dry-run` prints, output to a file
  specops      `job launch` (job record, tmux, wrapper) of `python -m specops step train --fresh`,
               exactly what `invoke train` starts on a host
The run config names the optimizer (speculators 0.9's default is Muon), logs every 10 steps and
leaves the loader's worker count at speculators' default (12) unless --workers says otherwise.
Tokens/s is measured on the wall clock between logged steps after the warm-up (see trainbench.py).
The compute limit of a step counts the draft's matmuls, the verifier LM head that makes the
targets, Muon's Newton-Schulz products (~27 TFLOP per step at 8B dimensions, whatever the batch)
and AdamW's memory traffic.

    PYTHONPATH=/tmp/site python bench/train_speculators.py          # H200 host (bench/device_setup.sh)
    PYTHONPATH=<patched site> python bench/train_speculators.py --tiny --steps 21 --tokens 128 256
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import trainbench as tb

TTT = 3


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny dimensions (smoke test, CPU)")
    parser.add_argument("--optimizers", nargs="+", default=["muon", "adamw"], choices=["muon", "adamw"])
    parser.add_argument("--tokens", nargs="+", type=int, default=[2048, 8192], help="tokens per step")
    parser.add_argument("--steps", type=int, default=61, help="steps per side (logged: 0, 10, ..)")
    parser.add_argument("--warmup", type=int, default=10, help="steps before the timed window")
    parser.add_argument("--log-freq", type=int, default=10)
    parser.add_argument("--workers", type=int, default=None, help="loader workers (default: speculators')")
    parser.add_argument("--sides", nargs="+", default=["speculators", "specops"], choices=["speculators", "specops"])
    parser.add_argument("--workdir", type=Path, default=None, help="keep inputs and logs here")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return parser.parse_args()


def direct_argv(env: dict[str, str], save: Path) -> list[str]:
    """The argv `step train` would run, with its own save path swapped for the direct side's."""
    argv = list(tb.agent(env, "step", "train", "--run", tb.RUN, "--dry-run")["command"])
    argv[argv.index("--save-path") + 1] = str(save)
    return argv


def run_variant(env: dict[str, str], workdir: Path, verifier: Path, shape: tb.Shape, variant: tb.Variant,
                sides: list[str], warmup: int) -> dict:
    tb.write_run_config(workdir, verifier, shape, variant)
    figures: dict = {"optimizer": variant.optimizer, "tokens_per_step": variant.tokens_per_step}
    results = {}
    for side in sides:
        if side == "speculators":
            save = workdir / f"direct-{variant.label}"
            result = tb.run_direct(env, direct_argv(env, save), save)
        else:
            result = tb.run_job(env, ["step", "train", "--run", tb.RUN, "--fresh"])
        if result.exit_code != 0:
            tail = "\n".join(result.log.read_text(errors="replace").splitlines()[-40:])
            sys.exit(f"{tail}\n{side} {variant.label}: training failed (exit {result.exit_code}); see {result.log}")
        results[side] = result
        # checkpoints are GBs at 8B dimensions: keep the logs, drop the weights
        for folder in [workdir / f"direct-{variant.label}", *(workdir / "runs" / tb.RUN).glob("checkpoints*")]:
            for checkpoint in folder.glob("[0-9]*"):
                shutil.rmtree(checkpoint, ignore_errors=True)
    # one token count for both sides (speculators' own count of a packed batch), so the ratio is time alone
    tokens = tb.tokens_per_step(*(result.log for result in results.values()))
    for side, result in results.items():
        steps_per_s, first, last = tb.window_rate(result, warmup)
        startup, teardown = result.stamps[min(result.stamps)], result.wall_s - result.stamps[max(result.stamps)]
        figures[side] = {"tokens_per_s": steps_per_s * tokens, "step_ms": 1000 / steps_per_s,
                         "tokens_per_step": tokens, "window": [first, last], "wall_s": result.wall_s,
                         "to_first_step_s": startup, "after_last_step_s": teardown, "log": str(result.log)}
        print(f"{variant.label:>12} {side:>11}: {steps_per_s * tokens:10.0f} tokens/s, "
              f"step {1000 / steps_per_s:7.1f} ms (steps {first}-{last}, {tokens:.0f} tokens/step; "
              f"wall {result.wall_s:.0f} s = {startup:.0f} s to step 0 + {teardown:.0f} s after the last)",
              file=sys.stderr)
    return figures


def main() -> None:
    args = parse_args()
    shape = tb.TINY if args.tiny else tb.EIGHT_B
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="bench-train-"))).resolve()
    env = tb.bench_env(workdir)
    print(f"inputs in {workdir}", file=sys.stderr)
    per_step = max(args.tokens) // shape.seq_len
    rows = int(args.steps * max(per_step, 1) / 0.95) + 16
    verifier = tb.make_run_inputs(shape, rows, workdir)
    variants = [tb.Variant(optimizer, tokens, args.steps, args.log_freq, args.workers)
                for tokens in args.tokens for optimizer in args.optimizers]
    rows_out = []
    for index, variant in enumerate(variants):
        sides = args.sides if index % 2 == 0 else list(reversed(args.sides))  # ABBA: drift hits both
        rows_out.append(run_variant(env, workdir, verifier, shape, variant, sides, args.warmup))

    print(f"\nsetting: hidden {shape.hidden}, vocab {shape.vocab}, draft vocab {shape.draft_vocab}, 1 draft layer, "
          f"ttt {TTT}, documents of {shape.seq_len}; {args.steps} steps per side, timed from the first logged "
          f"step >= {args.warmup}; log every {args.log_freq}; loader workers "
          f"{args.workers if args.workers is not None else 'speculators default (12)'}")
    header = (f"{'optimizer':>9} {'tok/step':>8} {'speculators':>12} {'specops':>10} {'ratio':>6} {'step ms':>8} "
              f"{'limit ms':>9} {'of limit':>8}  limit = model + optimizer")
    print(header)
    for row in rows_out:
        variant = tb.Variant(row["optimizer"], row["tokens_per_step"], args.steps)
        limit = tb.step_limit(shape, variant, TTT)
        row["limit"] = limit.__dict__
        direct, ours = row.get("speculators"), row.get("specops")
        measured = direct or ours
        ratio = f"{ours['tokens_per_s'] / direct['tokens_per_s']:6.3f}" if direct and ours else f"{'-':>6}"
        row["ratio"] = ours["tokens_per_s"] / direct["tokens_per_s"] if direct and ours else None
        print(f"{row['optimizer']:>9} {row['tokens_per_step']:>8} "
              f"{direct['tokens_per_s'] if direct else float('nan'):12.0f} "
              f"{ours['tokens_per_s'] if ours else float('nan'):10.0f} {ratio} {measured['step_ms']:8.1f} "
              f"{limit.ms:9.2f} {100 * limit.ms / measured['step_ms']:7.1f}%  "
              f"{limit.model_tflop:.2f} TFLOP + {limit.optimizer_tflop:.1f} TFLOP Newton-Schulz + "
              f"{limit.optimizer_gb:.1f} GB AdamW traffic")
    print(f"limit: FLOPs at {tb.BF16_PEAK_FLOPS / 1e12:.0f} TFLOP/s bf16, AdamW traffic at "
          f"{tb.HBM_BYTES_PER_S / 1e12:.1f} TB/s")
    if args.json:
        args.json.write_text(json.dumps(rows_out, indent=2) + "\n")


if __name__ == "__main__":
    main()
