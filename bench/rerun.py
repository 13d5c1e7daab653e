"""A re-run of a finished demo run (every step skips): this tree against another, side by side.

    python bench/rerun.py --before PATH [--n 3]

PATH is another checkout of specops (e.g. `git worktree add /tmp/before 81ef24a`). Each tree runs the
demo's whole pipeline once in a tiny workdir of its own (this checkout's .venv, one torch thread),
then, in turn with the other tree so that load from elsewhere hits both alike, times `step evaluate`
and `pipeline` (no doctor) on its finished run: what a user waits for when nothing changed. Prints
the median seconds of each with each tree and the ratio. Asserts nothing.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from samples_first import REPO, specops_in, tiny_template  # bench/ is first on the path of a bench script

COMMANDS = {"step evaluate (skips)": ["step", "evaluate", "--run", "tiny"],
            "pipeline (every step skips)": ["pipeline", "--run", "tiny"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--n", type=int, default=3)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "this": REPO}

    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="rerun-") as folder:
        template = tiny_template(Path(folder))
        workdirs = {}
        for label, tree in trees.items():
            workdirs[label] = Path(folder) / label
            shutil.copytree(template, workdirs[label])
            (workdirs[label] / "patches").symlink_to(tree / "patches")
            seconds = specops_in(tree, workdirs[label], COMMANDS["pipeline (every step skips)"])
            print(f"{label}: the first pipeline took {seconds:.1f} s", file=sys.stderr)
        for round_number in range(args.n):
            for command, argv in COMMANDS.items():
                for label, tree in trees.items():
                    seconds = specops_in(tree, workdirs[label], argv)
                    results.setdefault((command, label), []).append(seconds)
                    print(f"round {round_number + 1} {command} {label}: {seconds:.2f} s", file=sys.stderr)
    print(f"{'command':30} {'before s':>9} {'this s':>8} {'this/before':>12}")
    for command in COMMANDS:
        before = statistics.median(results[(command, "before")])
        this = statistics.median(results[(command, "this")])
        print(f"{command:30} {before:9.2f} {this:8.2f} {this / before:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
