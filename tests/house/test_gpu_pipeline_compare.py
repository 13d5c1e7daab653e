"""`bench/gpu_pipeline.py --compare A B`: where two runs of one config part. A `--repeat` file labels its
copies `run#1`, `run#2`; a single run is `run`: the first copy in A meets the last in B whatever the labels,
each digest equal or DIFFER, and the two acceptance figures with their difference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.repo import REPO

DIGESTS = {"regenerated": "r1", "prepared": "p1", "hidden_states": "h1", "vocab": "v1", "target": "t1"}


def entry(acceptance: float, **digests: str) -> dict:
    return {"digests": {**DIGESTS, **digests},
            "pipeline": {"evaluation": {"report": {"mean_acceptance_length": acceptance}}}}


def compared(tmp_path: Path, first: dict, second: dict) -> str:
    paths = []
    for name, runs in (("a.json", first), ("b.json", second)):
        (tmp_path / name).write_text(json.dumps({"gpus": 1, "runs": runs}))
        paths.append(str(tmp_path / name))
    done = subprocess.run([sys.executable, "bench/gpu_pipeline.py", "--compare", *paths], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_repeat_copy_meets_a_single_run_of_the_same_config(tmp_path: Path) -> None:
    shown = compared(tmp_path, {"kimi#1": entry(1.3112), "kimi#2": entry(9.0, prepared="other")},
                     {"kimi": entry(1.3112, hidden_states="h2")})
    lines = {line.split()[0]: line for line in shown.splitlines()[1:]}
    assert "kimi#1" in shown.splitlines()[0] and "kimi#2" not in shown
    assert lines["regenerated"].endswith("equal") and lines["prepared"].endswith("equal")
    assert lines["hidden_states"].endswith("DIFFER")
    assert lines["acceptance"].split()[1:3] == ["1.3112", "1.3112"] and lines["acceptance"].endswith("0.0")


def test_configs_only_one_file_holds_are_not_compared(tmp_path: Path) -> None:
    shown = compared(tmp_path, {"kimi": entry(1.0)}, {"llama": entry(1.0)})
    assert shown.strip() == ""
