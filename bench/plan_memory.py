"""The plan's training memory against what `speculators train` really takes on the GPU, side by side.

    source bench/device_setup.sh    # the H200 (bench/README.md, "On the H200"): wheels, patches, tmux
    python3 bench/plan_memory.py [--variants adamw:8192 adamw:16384 muon:8192] [--steps 21] [--json F]

On the synthetic inputs of the training benches (trainbench.py: Llama-3.1-8B dimensions, target vocab
128256, draft vocab 32000, one draft layer, ttt 3, documents of 2048 tokens), per variant (optimizer :
tokens per step): `python -m specops plan --run bench` (the figures `invoke plan` prints and `run check`
judges a mode by), then `speculators train` run directly with the argv `step train --dry-run` prints,
while a thread samples every 0.1 s the GPU memory NVML charges to each process (nvidia-smi's compute
apps: the trainer is the only one) and the GPU's used memory. Prints per variant the plan's parts and
total against the measured peak, and, from two token counts of one optimizer, the measured memory per
extra token against the plan's activation bytes per token. Asserts nothing.

    python bench/plan_memory.py --tiny --steps 6     # a smoke run of this script on a CPU (no memory)
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import trainbench as tb
from train_speculators import direct_argv  # the argv `step train --dry-run` prints

GIB = 2**30


class ProcessMemory:
    """Peak GPU memory (MiB) of all compute processes together and of the whole GPU, sampled on a thread."""

    def __init__(self, period_s: float = 0.1, progress: Path | None = None) -> None:
        self.period_s, self.process_peak, self.used_peak, self.idle = period_s, 0.0, 0.0, self._used()
        self.progress = progress  # the peaks so far, rewritten each second: a run cut off keeps them
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _query(what: str) -> list[float]:
        if not shutil.which("nvidia-smi"):
            return []
        out = subprocess.run(["nvidia-smi", f"--query-{what}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=False).stdout
        return [float(line.split(",")[-1]) for line in out.splitlines() if line.strip()]

    def _used(self) -> float:
        return sum(self._query("gpu=memory.used"))

    def _loop(self) -> None:
        written = time.monotonic()
        while not self._stop.wait(self.period_s):
            self.process_peak = max(self.process_peak, sum(self._query("compute-apps=pid,used_memory")))
            self.used_peak = max(self.used_peak, self._used())
            if self.progress is not None and time.monotonic() - written >= 1.0:
                written = time.monotonic()
                self.progress.write_text(json.dumps({"process_peak_mib": self.process_peak,
                                                     "used_peak_mib": self.used_peak, "idle_mib": self.idle}))

    def __enter__(self) -> ProcessMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def measure(env: dict[str, str], workdir: Path, verifier: Path, shape: tb.Shape, variant: tb.Variant,
            rows: int, progress: Path | None = None) -> dict:
    tb.write_run_config(workdir, verifier, shape, variant)
    trainer = tb.agent(env, "plan", "--run", tb.RUN, "--samples", str(rows))["trainer"]
    save = workdir / f"direct-{variant.label}"
    with ProcessMemory(progress=progress) as memory:
        result = tb.run_direct(env, direct_argv(env, save), save)
    if result.exit_code != 0:
        tail = "\n".join(result.log.read_text(errors="replace").splitlines()[-30:])
        sys.exit(f"{tail}\n{variant.label}: training failed (exit {result.exit_code}); see {result.log}")
    shutil.rmtree(save, ignore_errors=True)  # GBs of checkpoints at 8B dimensions
    return {"variant": variant.label, "optimizer": variant.optimizer, "tokens_per_step": variant.tokens_per_step,
            "plan": trainer, "measured_process_bytes": int(memory.process_peak * 2**20),
            "measured_gpu_used_bytes": int((memory.used_peak - memory.idle) * 2**20), "wall_s": round(result.wall_s, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["adamw:8192", "adamw:16384", "muon:8192"])
    parser.add_argument("--steps", type=int, default=21)
    parser.add_argument("--tiny", action="store_true", help="tiny dimensions (smoke run on a CPU)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here (after each variant)")
    args = parser.parse_args()
    shape = tb.TINY if args.tiny else tb.EIGHT_B
    variants = [tb.Variant(name.split(":")[0], int(name.split(":")[1]), args.steps, log_freq=5)
                for name in args.variants]
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="bench-plan-memory-"))).resolve()
    env = tb.bench_env(workdir)
    rows = int(args.steps * max(max(v.tokens_per_step for v in variants) // shape.seq_len, 1) / 0.95) + 16
    started = time.perf_counter()
    verifier = tb.make_run_inputs(shape, rows, workdir)
    print(f"inputs in {workdir} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    figures = []
    for variant in variants:
        progress = args.json.with_name(f'{args.json.stem}-{variant.label}-peak.json') if args.json else None
        figures.append(measure(env, workdir, verifier, shape, variant, rows, progress))
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"{variant.label}: {figures[-1]}", file=sys.stderr)

    print(f"\nhidden {shape.hidden}, target vocab {shape.vocab}, draft vocab {shape.draft_vocab}, 1 draft layer, "
          f"ttt 3; {args.steps} steps each; GiB")
    print(f"{'variant':>12} {'params':>7} {'grads':>6} {'optim':>6} {'activ':>6} {'reserve':>7} {'plan':>6} "
          f"{'measured':>8} {'gpu used':>8} {'measured/plan':>13}")
    for row in figures:
        plan, measured = row["plan"], row["measured_process_bytes"]
        print(f"{row['variant']:>12} {plan['params_bytes'] / GIB:7.2f} {plan['grad_bytes'] / GIB:6.2f} "
              f"{plan['optimizer_bytes'] / GIB:6.2f} {plan['activation_bytes'] / GIB:6.2f} "
              f"{plan['reserve_bytes'] / GIB:7.2f} {plan['total_bytes'] / GIB:6.2f} {measured / GIB:8.2f} "
              f"{row['measured_gpu_used_bytes'] / GIB:8.2f} {measured / max(plan['total_bytes'], 1):13.3f}")
    by_optimizer: dict[str, list[dict]] = {}
    for row in figures:
        by_optimizer.setdefault(row["optimizer"], []).append(row)
    for optimizer, rows_of in by_optimizer.items():
        if len(rows_of) < 2:
            continue
        low, high = sorted(rows_of, key=lambda row: row["tokens_per_step"])[::len(rows_of) - 1]
        extra = high["tokens_per_step"] - low["tokens_per_step"]
        measured = (high["measured_process_bytes"] - low["measured_process_bytes"]) / extra
        planned = (high["plan"]["activation_bytes"] - low["plan"]["activation_bytes"]) / extra
        print(f"{optimizer}: per extra token measured {measured / 1024:.1f} KiB, the plan's activations "
              f"{planned / 1024:.1f} KiB (measured/plan {measured / max(planned, 1):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
