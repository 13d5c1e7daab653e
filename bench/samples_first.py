"""`step extract --samples 10` and the demo's whole pipeline on a fresh tiny workdir: this tree against another.

    python bench/samples_first.py --before PATH [--n 2] [--no-pipeline]

PATH is another checkout of specops (e.g. `git worktree add /tmp/before c8b83d4`); both run with this
checkout's .venv, one torch thread each, on fresh copies of the same tiny workdir (the demo's run:
regenerate on), in turn, so load from elsewhere hits them alike. Prints the median seconds of each
command with each tree, the ratio, and how many conversations regenerate asked the target (this tree
asks only as many as the N rows need; an older one asks every conversation). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"
COMMANDS = {"extract --samples 10": ["step", "extract", "--run", "tiny", "--samples", "10"],
            "pipeline (demo, 200 samples)": ["pipeline", "--run", "tiny"]}


def specops_in(tree: Path, workdir: Path, args: list[str]) -> float:
    """Seconds of `python -m specops ARGS` with `tree`'s source on `workdir` (one torch thread, offline)."""
    if args[:1] == ["pipeline"] and (tree / "src" / "specops" / "pipeline" / "driver.py").exists():
        args = [*args, "--skip-doctor"]  # a tree before the step table ran the doctor in its agent pipeline
    env = {**os.environ, "SPECOPS_WORKDIR": str(workdir), "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    started = time.monotonic()
    done = subprocess.run([str(PYTHON), "-m", "specops", *args], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=1800)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return seconds


def tiny_template(folder: Path) -> Path:
    """A tiny workdir with the demo's run and its model and data, to copy for each measurement."""
    from specops.pipeline.data import tiny

    template = folder / "template"
    (template / "runs").mkdir(parents=True)
    (template / "runs" / "tiny.yaml").write_text((REPO / "runs" / "tiny.yaml").read_text())
    tiny.generate(template)
    return template


def timed(tree: Path, workdir: Path, args: list[str]) -> tuple[float, dict]:
    seconds = specops_in(tree, workdir, args)
    manifest = json.loads((workdir / "runs" / "tiny" / "manifest.json").read_text())
    return seconds, manifest["steps"]["regenerate"]["counts"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--no-pipeline", action="store_true", help="time only extract --samples 10")
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "this": REPO}
    commands = {name: argv for name, argv in COMMANDS.items() if not (args.no_pipeline and name.startswith("pipe"))}

    results: dict[tuple[str, str], list[float]] = {}
    asked: dict[tuple[str, str], str] = {}
    with tempfile.TemporaryDirectory(prefix="samples-first-") as folder:
        template = tiny_template(Path(folder))
        for round_number in range(args.n):
            for command, argv in commands.items():
                for label, tree in trees.items():
                    # one workdir per round, command and tree
                    workdir = Path(folder) / f"{label}-{round_number}-{command.split()[0]}"
                    shutil.copytree(template, workdir)
                    (workdir / "patches").symlink_to(tree / "patches")
                    seconds, counts = timed(tree, workdir, argv)
                    results.setdefault((command, label), []).append(seconds)
                    whole = counts.get("conversations", 0) + counts.get("failed", 0)  # older records: all asked
                    asked[(command, label)] = str(counts.get("answered", whole))
                    print(f"round {round_number + 1} {command} {label}: {seconds:.1f} s", file=sys.stderr)
    print(f"{'command':32} {'before s':>9} {'this s':>8} {'this/before':>12}  conversations asked (before, this)")
    for command in commands:
        before = statistics.median(results[(command, "before")])
        this = statistics.median(results[(command, "this")])
        print(f"{command:32} {before:9.1f} {this:8.1f} {this / before:12.2f}  "
              f"{asked[(command, 'before')]}, {asked[(command, 'this')]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
