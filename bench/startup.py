"""CLI start-up with no network at all: specops' tasks against Invoke's own floor, `invoke --version`.

    .venv/bin/python bench/startup.py [--n 7] [--before PATH]

Times, after one warm-up each, N rounds of all of these in turn (a fresh process each; median ms):

  invoke --version       Invoke alone: the interpreter and Invoke's imports (its floor)
  invoke --list          + finding and importing tasks.py (every task module)
  invoke hosts --json    + loading the inventory (a local host only) and printing JSON
  invoke hosts           + the human table (rich)

With --before PATH (another checkout), the same rows for that tree, interleaved. Ratios are against
`invoke --version` of the same round set. Prints figures, asserts nothing.
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

REPO = Path(__file__).resolve().parents[1]
INVOKE = REPO / ".venv" / "bin" / "invoke" if (REPO / ".venv").exists() else Path(sys.executable).parent / "invoke"
ROWS = [("invoke --version", ["--version"]), ("invoke --list", ["--list"]),
        ("invoke hosts --json", ["hosts", "--json"]), ("invoke hosts", ["hosts"])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=7, help="rounds (after one warm-up)")
    parser.add_argument("--before", type=Path, help="another checkout, timed alongside")
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="specops-bench-startup-"))
    try:
        inventory = root / "inventory.yaml"
        inventory.write_text(f"default: local\nhosts:\n  local:\n    connection: local\n    workdir: {root / 'wd'}\n"
                             f"    python: {sys.executable}\n")
        env = {key: value for key, value in os.environ.items() if not key.startswith("SPECOPS_")}
        env.update(SPECOPS_INVENTORY=str(inventory), SPECOPS_LOGS=str(root / "logs"), NO_COLOR="1")
        trees = [("this", REPO)] + ([("before", options.before.resolve())] if options.before else [])
        times: dict[tuple[str, str], list[float]] = {}
        load_before = os.getloadavg()[0]
        for round_index in range(options.n + 1):
            for tree_name, tree in trees:
                for name, args in ROWS:
                    begun = time.perf_counter()
                    subprocess.run([str(INVOKE), *args], cwd=tree, env=env, capture_output=True, check=True,
                                   timeout=120)
                    if round_index:  # round 0 is the warm-up
                        times.setdefault((tree_name, name), []).append(time.perf_counter() - begun)
        print(f"specops CLI start-up, {options.n} rounds after one warm-up, {os.cpu_count()} CPUs, "
              f"load {load_before:.1f} before / {os.getloadavg()[0]:.1f} after")
        print(f"{'command':22} {'tree':7} {'median ms':>10} {'x --version':>12}")
        for tree_name, _tree in trees:
            floor = statistics.median(times[tree_name, "invoke --version"])
            for name, _args in ROWS:
                median = statistics.median(times[tree_name, name])
                print(f"{name:22} {tree_name:7} {median * 1000:10.1f} {median / floor:12.2f}")
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
