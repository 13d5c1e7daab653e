"""The doctor's cache as the control side meets it: several workdirs on one host, and one workdir that a
run has written into since its last doctor. This tree against another checkout, side by side.

Each tree gets a fresh analysis cache (SPECOPS_ANALYSIS_CACHE) and three workdirs, each holding that
tree's `src/specops` bundle and `runs/`; the agent runs as `remote/agent.py` starts it on a host:
`python -m specops doctor --run tiny` from the workdir, with the bundle on PYTHONPATH. The calls:

  1. first workdir, empty cache (cold: the static analysis and the import probe run)
  2. the same workdir again, after a run wrote into it (a log folder, a manifest)
  3. a second workdir on the same host
  4. a third workdir, its agent run as a script (`python <workdir>/src/specops/__main__.py`)

Prints seconds and CPU seconds (the doctor and its probe child) of each call, which parts came from
the cache, and this tree's seconds over the other's per call. Asserts nothing.

    .venv/bin/python bench/doctor_workdirs.py --before PATH [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CALLS = ("first workdir, cold", "same workdir, written into", "second workdir", "third workdir, as a script")


def workdir_of(tree: Path, root: Path) -> Path:
    root.mkdir(parents=True)
    shutil.copytree(tree / "src" / "specops", root / "src" / "specops", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(tree / "runs", root / "runs")
    return root


def doctor(workdir: Path, cache: Path, as_script: bool) -> tuple[float, float, dict]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SPECOPS_")}
    env.update(SPECOPS_WORKDIR=str(workdir), PYTHONPATH=str(workdir / "src"), SPECOPS_ANALYSIS_CACHE=str(cache))
    command = [str(workdir / "src" / "specops" / "__main__.py")] if as_script else ["-m", "specops"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, *command, "doctor", "--run", "tiny"], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    lines = done.stdout.strip().splitlines()
    document = json.loads(lines[-1]) if lines else {}
    return seconds, cpu, document.get("cache") or {}


def one_round(tree: Path, scratch: Path) -> list[tuple[float, float, dict]]:
    cache = scratch / "cache"
    first, second, third = (workdir_of(tree, scratch / name) for name in ("w1", "w2", "w3"))
    results = [doctor(first, cache, as_script=False)]
    (first / "logs").mkdir()
    (first / "manifest.json").write_text("{}")
    results.append(doctor(first, cache, as_script=False))
    results.append(doctor(second, cache, as_script=False))
    results.append(doctor(third, cache, as_script=True))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="another checkout (its src/ and runs/)")
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    for needed in ("src/specops/__main__.py", "runs/tiny.yaml"):
        if not (options.before / needed).is_file():
            parser.error(f"--before {options.before}: no {needed} (another checkout of specops)")
    trees = {"before": options.before.resolve(), "this": REPO}
    rows: dict[str, list[list[tuple[float, float, dict]]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="specops-bench-doctor-") as scratch:
        for round_index in range(options.rounds):  # the trees in turn, so load hits both alike
            for name, tree in trees.items():
                rows[name].append(one_round(tree, Path(scratch) / f"{name}-{round_index}"))
    print(f"{'call':32} {'before s (cpu)':>16} {'this s (cpu)':>16} {'this/before':>11}  cache hits (before | this)")
    def median(name: str, index: int, part: int) -> float:
        values = sorted(result[index][part] for result in rows[name])
        return values[len(values) // 2]

    for index, call in enumerate(CALLS):
        hits = " | ".join(json.dumps(rows[name][-1][index][2], sort_keys=True) for name in trees)
        ratio = median("this", index, 0) / median("before", index, 0)
        print(f"{call:32} {median('before', index, 0):7.2f} ({median('before', index, 1):5.2f}) "
              f"{median('this', index, 0):7.2f} ({median('this', index, 1):5.2f}) {ratio:11.2f}  {hits}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
