"""Online against offline training on the tiny run, side by side: wall time and peak hidden-state disk.

    python bench/online_offline.py [--samples N] [--epochs E] [--evaluate]

One tiny workdir is made and its answers regenerated and prepared once (`step prepare`, `step vocab`);
two copies of it then train the same rows:
  offline  `step extract` (hf backend: every row's file on disk) then `step train` (--on-missing raise)
  online   `step train` with `hidden_states.mode: online`: the run's vllm-server job (the serve env,
           .venv-vllm, vLLM's CPU build; its load is counted) and speculators asking it for every row
A thread samples the bytes of every file under the run's hidden_states/ and vllm_staging/ every 20 ms.
Prints seconds and peak bytes of each and the ratios online/offline; with --evaluate also the
held-out acceptance length of both drafts (hf replay). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from samples_first import PYTHON, REPO, tiny_template  # bench/ is first on the path of a bench script

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
sys.path.insert(0, str(REPO / "src"))  # this tree's specops, not whichever the venv has installed


def specops(workdir: Path, *args: str) -> dict:
    env = {**os.environ, "SPECOPS_WORKDIR": str(workdir), "PYTHONPATH": str(REPO / "src"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON),
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([str(PYTHON), "-m", "specops", *args], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=7200)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed in {workdir}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


class PeakBytes:
    """The largest total seen of every file's bytes under these folders, sampled every 20 ms."""

    def __init__(self, *folders: Path) -> None:
        self.folders, self.peak, self._stop = folders, 0, threading.Event()

    def _now(self) -> int:
        total = 0
        for folder in self.folders:
            for entry in folder.glob("*") if folder.is_dir() else []:
                try:
                    total += entry.stat().st_size if entry.is_file() else 0
                except OSError:
                    pass
        return total

    def __enter__(self) -> PeakBytes:
        def loop() -> None:
            while not self._stop.wait(0.02):
                self.peak = max(self.peak, self._now())

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def stop_server(workdir: Path) -> None:
    os.environ["SPECOPS_WORKDIR"] = str(workdir)
    from specops.jobs import launching, stopping
    from specops.jobs.tmux import TmuxServer

    job = launching.running_job("vllm-server", "tiny", TmuxServer(workdir))
    if job is not None:
        stopping.stop(job, 20.0, TmuxServer(workdir))


def measure(workdir: Path, steps: list[list[str]]) -> tuple[float, int]:
    run_dir = workdir / "runs" / "tiny"
    with PeakBytes(run_dir / "hidden_states", run_dir / "vllm_staging") as disk:
        started = time.monotonic()
        for args in steps:
            specops(workdir, *args)
        seconds = time.monotonic() - started
    return seconds, disk.peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=None, help="rows (default: the run's 200)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs (default: the run's 4)")
    parser.add_argument("--evaluate", action="store_true", help="also score both drafts on the held-out prompts")
    args = parser.parse_args()
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"{VLLM_PYTHON} is absent: run scripts/setup-vllm.sh")
    with tempfile.TemporaryDirectory(prefix="online-offline-") as folder:
        template = tiny_template(Path(folder))
        (template / "patches").symlink_to(REPO / "patches")
        config_file = template / "runs" / "tiny.yaml"
        config = yaml.safe_load(config_file.read_text())
        if args.samples:
            config["samples"] = args.samples
        config["vllm"]["port"] = 8000 + os.getpid() % 1000
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        specops(template, "patch", "apply")  # the CPU trainer's shims, as the pipeline applies them
        specops(template, "step", "prepare", "--run", "tiny")
        specops(template, "step", "vocab", "--run", "tiny")
        workdirs = {}
        for mode in ("offline", "online"):
            workdirs[mode] = Path(folder) / mode
            shutil.copytree(template, workdirs[mode], symlinks=True)
        online_config = workdirs["online"] / "runs" / "tiny.yaml"
        edited = yaml.safe_load(online_config.read_text())
        # online asks the run's vLLM server (the plan wants the vllm backend); answers and scoring stay hf
        # the parity gate's served request (a server load of its own on a vllm run) is not online's cost
        edited.update(backend="vllm", hidden_states={"mode": "online"}, parity={"serve": False})
        edited["regenerate"]["backend"] = "hf"
        edited.setdefault("evaluate", {})["backend"] = "hf"
        online_config.write_text(yaml.safe_dump(edited, sort_keys=False))
        epochs = ["--epochs", str(args.epochs)] if args.epochs else []
        results = {}
        try:
            results["offline"] = measure(workdirs["offline"], [["step", "extract", "--run", "tiny"],
                                                               ["step", "train", "--run", "tiny", *epochs]])
            print(f"offline: {results['offline'][0]:.1f} s, peak {results['offline'][1]} bytes", file=sys.stderr)
            results["online"] = measure(workdirs["online"], [["step", "train", "--run", "tiny", *epochs]])
            print(f"online: {results['online'][0]:.1f} s, peak {results['online'][1]} bytes", file=sys.stderr)
            acceptance = {}
            if args.evaluate:
                for mode, workdir in workdirs.items():
                    report = specops(workdir, "step", "evaluate", "--run", "tiny", "--backend", "hf")["report"]
                    acceptance[mode] = report["mean_acceptance_length"]
        finally:
            stop_server(workdirs["online"])
    samples = args.samples or config.get("samples")
    print(f"tiny run, {samples} samples, {args.epochs or config['train']['epochs']} epochs; offline = extract + "
          "train, online = train with the run's vLLM server (its load included)")
    print(f"{'':10} {'wall s':>9} {'peak disk bytes':>16}" + (f" {'acceptance':>11}" if acceptance else ""))
    for mode in ("offline", "online"):
        seconds, peak = results[mode]
        print(f"{mode:10} {seconds:9.1f} {peak:16d}" + (f" {acceptance[mode]:11.3f}" if acceptance else ""))
    ratio_time = results["online"][0] / results["offline"][0]
    ratio_disk = results["online"][1] / max(results["offline"][1], 1)
    print(f"{'online/offline':10} {ratio_time:9.2f} {ratio_disk:16.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
