"""The agent's collector settings (specops.collector) against CPython's defaults, side by side in one run.

    .venv/bin/python bench/collector.py [--n 5]

Each row runs the same child both ways, in turn, N times (so load from elsewhere hits both alike) and
prints the median CPU seconds (user + system, the child's own rusage) and wall seconds of each, and the
ratio. The rows: importing torch, transformers and datasets and exiting; importing speculators and
exiting (what the doctor's import probe does); and real agent steps on a fresh tiny workdir (`step
prepare`, `step extract --samples 20`), the agent started as `python -m specops` (the settings) or
through `specops.cli.main` directly (the defaults). Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from samples_first import PYTHON, REPO, tiny_template  # bench/ is first on the path of a bench script

# the agent's settings around a bare import: what `python -m specops` does around its command
SETTINGS = "from specops import collector; collector.for_imports()\n"
FREEZE = "\ncollector.before_exit()"
IMPORTS = {"import torch, transformers, datasets": "import torch, transformers, datasets",
           "import speculators": "import speculators"}
AGENT_DEFAULT = "import sys; from specops.cli import main; raise SystemExit(main())"
STEPS = {"agent: step prepare": ["step", "prepare", "--run", "tiny", "--samples", "20"],
         "agent: step extract --samples 20": ["step", "extract", "--run", "tiny", "--samples", "20"]}


def measured(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(CPU s, wall s) of one child."""
    started = time.monotonic()
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.monotonic() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed:\n{process.stderr.read().decode()[-3000:]}")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error"}
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="collector-") as folder:
        template = tiny_template(Path(folder))
        for round_number in range(args.n):
            for name, code in IMPORTS.items():
                for label, snippet in (("default", code), ("settings", SETTINGS + code + FREEZE)):
                    results.setdefault((name, label), []).append(
                        measured([str(PYTHON), "-c", snippet], Path(folder), env))
            for label, launcher in (("default", ["-c", AGENT_DEFAULT]), ("settings", ["-m", "specops"])):
                workdir = Path(folder) / f"{label}-{round_number}"
                shutil.copytree(template, workdir)
                step_env = {**env, "SPECOPS_WORKDIR": str(workdir)}
                for name, step in STEPS.items():  # in order: extract reads what prepare wrote
                    results.setdefault((name, label), []).append(
                        measured([str(PYTHON), *launcher, *step], workdir, step_env))
    print(f"{'child':36} {'default CPU s':>14} {'settings CPU s':>15} {'ratio':>6} "
          f"{'default s':>10} {'settings s':>11}")
    for name in [*IMPORTS, *STEPS]:
        default, settings = results[(name, "default")], results[(name, "settings")]
        cpu_d, cpu_s = (statistics.median(cpu for cpu, _ in runs) for runs in (default, settings))
        wall_d, wall_s = (statistics.median(wall for _, wall in runs) for runs in (default, settings))
        print(f"{name:36} {cpu_d:14.2f} {cpu_s:15.2f} {cpu_s / cpu_d:6.2f} {wall_d:10.2f} {wall_s:11.2f}")
    print(f"(medians of {args.n}; python {sys.version.split()[0]}; OMP_NUM_THREADS=1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
