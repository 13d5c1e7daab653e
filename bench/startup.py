"""CLI start-up with no network at all: specops' tasks against Invoke's own floor, `invoke --version`.

    .venv/bin/python bench/startup.py [--n 7] [--before PATH] [--no-bytecode]

Times, after one warm-up each, N rounds of all of these in turn (a fresh process each; median ms):

  invoke --version       Invoke alone: the interpreter and Invoke's imports (its floor)
  invoke --list          + finding and importing tasks.py (every task module)
  invoke hosts --json    + loading the inventory (a local host only) and printing JSON
  invoke hosts           + the human table (rich), stdout a pipe (rich's no-colour layout)
  ... (terminal)         `invoke --version` and `invoke hosts` again with a pseudo-terminal as
                         stdout (`script -qec CMD /dev/null`): rich's terminal path, colours on;
                         their ratio is against `invoke --version (terminal)`, the same pty cost

With --before PATH (another checkout), the same rows for that tree, interleaved. Ratios are against
`invoke --version` of the same round set. Each tree runs with its own src/ first on PYTHONPATH.
Python writes and reuses bytecode caches as it does for a user; --no-bytecode sets
PYTHONDONTWRITEBYTECODE=1 (as some sandboxes do), which makes every run compile the checkout's own
modules while the installed packages keep their caches. Also prints the median CPU time (user +
system) of each command, steadier than wall time on a loaded machine. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INVOKE = REPO / ".venv" / "bin" / "invoke" if (REPO / ".venv").exists() else Path(sys.executable).parent / "invoke"
ROWS = [("invoke --version", ["--version"], False), ("invoke --list", ["--list"], False),
        ("invoke hosts --json", ["hosts", "--json"], False), ("invoke hosts", ["hosts"], False),
        ("invoke --version (terminal)", ["--version"], True), ("invoke hosts (terminal)", ["hosts"], True)]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=7, help="rounds (after one warm-up)")
    parser.add_argument("--before", type=Path, help="another checkout, timed alongside")
    parser.add_argument("--no-bytecode", action="store_true", help="PYTHONDONTWRITEBYTECODE=1 for every command")
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="specops-bench-startup-"))
    terminal = shutil.which("script")
    try:
        inventory = root / "inventory.yaml"
        inventory.write_text(f"default: local\nhosts:\n  local:\n    connection: local\n    workdir: {root / 'wd'}\n"
                             f"    python: {sys.executable}\n")
        env = {key: value for key, value in os.environ.items()
               if not key.startswith("SPECOPS_") and key != "PYTHONDONTWRITEBYTECODE"}
        env.update(SPECOPS_INVENTORY=str(inventory), SPECOPS_LOGS=str(root / "logs"))
        if options.no_bytecode:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        trees = [("this", REPO)] + ([("before", options.before.resolve())] if options.before else [])
        rows = [row for row in ROWS if terminal or not row[2]]
        times: dict[tuple[str, str], list[float]] = {}
        cpu: dict[tuple[str, str], list[float]] = {}
        load_before = os.getloadavg()[0]
        for round_index in range(options.n + 1):
            for tree_name, tree in trees:
                tree_env = {**env, "PYTHONPATH": f"{tree / 'src'}:{tree}"}
                for name, args, on_terminal in rows:
                    argv = [str(INVOKE), *args]
                    if on_terminal:
                        argv = [str(terminal), "-qec", shlex.join(argv), "/dev/null"]
                    # NO_COLOR off on the terminal: the path a person at a terminal gets, colours included
                    run_env = tree_env if on_terminal else {**tree_env, "NO_COLOR": "1"}
                    cpu_before, begun = children_cpu(), time.perf_counter()
                    subprocess.run(argv, cwd=tree, env=run_env, capture_output=True, check=True, timeout=120)
                    if round_index:  # round 0 is the warm-up (and writes the bytecode caches)
                        times.setdefault((tree_name, name), []).append(time.perf_counter() - begun)
                        cpu.setdefault((tree_name, name), []).append(children_cpu() - cpu_before)
        print(f"specops CLI start-up, {options.n} rounds after one warm-up, {os.cpu_count()} CPUs, "
              f"load {load_before:.1f} before / {os.getloadavg()[0]:.1f} after, bytecode caches "
              f"{'off' if options.no_bytecode else 'on'}")
        print(f"{'command':30} {'tree':7} {'median ms':>10} {'x --version':>12} {'cpu ms':>8} {'cpu x':>6}")
        for tree_name, _tree in trees:
            for name, _args, on_terminal in rows:
                floor_name = "invoke --version (terminal)" if on_terminal else "invoke --version"
                floor = statistics.median(times[tree_name, floor_name])
                floor_cpu = statistics.median(cpu[tree_name, floor_name])
                median = statistics.median(times[tree_name, name])
                median_cpu = statistics.median(cpu[tree_name, name])
                print(f"{name:30} {tree_name:7} {median * 1000:10.1f} {median / floor:12.2f} "
                      f"{median_cpu * 1000:8.1f} {median_cpu / floor_cpu:6.2f}")
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
