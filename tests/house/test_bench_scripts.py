"""The benchmarks still run: every bench/ script with a main answers `--help` (its imports resolve, its parser
builds), and bench/README.md's table of current figures has a row for each of them and none for a script that
is gone.

Nothing in the suite times a benchmark. This keeps them from rotting between measurements: a moved module, a
renamed helper or a deleted library script fails here, not on the day a GPU machine is lent for a figure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from tests.support.repo import REPO

BENCH = REPO / "bench"
SCRIPTS = sorted(path.name for path in BENCH.glob("*.py") if 'if __name__ == "__main__":' in path.read_text())


def _help(script: str) -> tuple[str, int, str]:
    # as a user runs it, from the checkout's root with nothing on PYTHONPATH: a script finds src/ and testing/ itself
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, f"bench/{script}", "--help"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=180)
    return script, done.returncode, done.stdout + done.stderr


def test_every_bench_script_answers_help() -> None:
    assert len(SCRIPTS) > 10
    with ThreadPoolExecutor(max_workers=4) as pool:  # a few import torch: ~1-3 s each on a loaded 2-core machine
        answers = list(pool.map(_help, SCRIPTS))
    failed = {script: output[-1500:] for script, code, output in answers if code != 0 or "usage:" not in output}
    assert failed == {}


def _tabled() -> set[str]:
    """The scripts the README's first table (its current figures) has a row for."""
    text = (BENCH / "README.md").read_text()
    table = text[text.index("\n|"):].split("\n\n", 1)[0]
    return {match for row in table.splitlines()[2:] for match in re.findall(r"^\| `?(?:bench/)?(\w+\.py)", row)}


def test_the_readme_table_has_a_row_for_every_script_and_none_for_a_gone_one() -> None:
    tabled = _tabled()
    assert tabled - set(SCRIPTS) == set()  # a row whose script is gone
    assert set(SCRIPTS) - tabled == set()  # a script without its current figure
