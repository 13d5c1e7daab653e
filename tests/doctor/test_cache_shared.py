"""The doctor's slow parts are cached per host, not per workdir: the agent's own bundle folder and its
workdir (first on the path, as the control side starts it: `python -m specops` from the workdir) are not
part of what the run's Python sees, so a second workdir on the same host reads the first one's analysis
and import probe, and a workdir the run has written into since reads its own again."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.agent import SRC, agent_env


def _doctor_from_bundle(workdir: Path, cache: Path, *, as_script: bool = False) -> dict:
    """`python -m specops doctor` from the workdir with its bundle on PYTHONPATH, as the control side
    starts the agent (remote/agent.py); `as_script`: `python <workdir>/src/specops/__main__.py doctor`."""
    if not (workdir / "src" / "specops").exists():
        shutil.copytree(SRC / "specops", workdir / "src" / "specops", ignore=shutil.ignore_patterns("__pycache__"))
    env = agent_env(workdir, extra={"SPECOPS_ANALYSIS_CACHE": str(cache)})
    env["PYTHONPATH"] = str(workdir / "src")  # the bundle only, as on a host
    command = [str(workdir / "src" / "specops" / "__main__.py")] if as_script else ["-m", "specops"]
    done = subprocess.run([sys.executable, *command, "doctor"], cwd=workdir,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


CACHED = {"import": True, "api": True, "http": True}


def test_a_second_workdir_on_the_same_host_reads_the_doctor_from_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _doctor_from_bundle(tmp_path / "first", cache)
    second = _doctor_from_bundle(tmp_path / "second", cache)
    assert first["cache"] == {"import": False, "api": False, "http": False}
    assert second["cache"] == CACHED
    assert [finding["why"] for finding in second["findings"]] == [finding["why"] for finding in first["findings"]]
    # a row about the agent's own files (the pipeline's calls) names this workdir's copy, never the first's (issue 59)
    own = [finding["where"] for finding in second["findings"] if "/specops/pipeline/" in finding["where"]]
    assert own and all(where.startswith(str(tmp_path / "second" / "src" / "specops" / "pipeline")) for where in own)
    assert [finding["where"].replace(str(tmp_path / "second"), str(tmp_path / "first"))
            for finding in second["findings"]] == [finding["where"] for finding in first["findings"]]
    # the run writes into its workdir between two doctors (logs, state, outputs): still the cached answers
    (tmp_path / "first" / "logs").mkdir()
    (tmp_path / "first" / "manifest.json").write_text("{}")
    assert _doctor_from_bundle(tmp_path / "first", cache)["cache"] == CACHED
    # and the agent run as a script reads the same entries, the first workdir gone since
    shutil.rmtree(tmp_path / "first")
    third = _doctor_from_bundle(tmp_path / "third", cache, as_script=True)
    assert third["cache"] == CACHED
    assert not any(str(tmp_path / "first") in finding["where"] for finding in third["findings"])
