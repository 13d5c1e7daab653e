"""The doctor's slow parts are cached per host, not per workdir: the agent's own bundle folder (first on
the path when it runs as a script) is not part of what the run's Python sees, so a second workdir on
the same host reads the first one's analysis and import probe."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.agent import SRC, agent_env


def _doctor_from_bundle(workdir: Path, cache: Path) -> dict:
    """`python <workdir>/src/specops/__main__.py doctor`, as the control side starts the agent."""
    shutil.copytree(SRC / "specops", workdir / "src" / "specops", ignore=shutil.ignore_patterns("__pycache__"))
    env = agent_env(workdir, extra={"SPECOPS_ANALYSIS_CACHE": str(cache)})
    done = subprocess.run([sys.executable, str(workdir / "src" / "specops" / "__main__.py"), "doctor"], cwd=workdir,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_workdir_on_the_same_host_reads_the_doctor_from_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _doctor_from_bundle(tmp_path / "first", cache)
    second = _doctor_from_bundle(tmp_path / "second", cache)
    assert first["cache"] == {"import": False, "api": False}
    assert second["cache"] == {"import": True, "api": True}
    assert [finding["id"] for finding in second["findings"]] == [finding["id"] for finding in first["findings"]]
