"""The hidden-state disk a run is projected to take is what its extraction writes, in the dtype it writes:
the fp32 tiny target (a CPU host computes "auto" in float32) against the files of a finished run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specops.planning import human
from tests.support.agent import REPO, run_agent
from tests.support.finished import copy_of


def _written(workdir: Path) -> int:
    return sum(path.stat().st_size for path in (workdir / "runs" / "tiny" / "hidden_states").glob("hs_*.safetensors"))


@pytest.mark.slow
def test_the_fp32_tiny_run_is_projected_at_the_bytes_it_wrote(finished: tuple[Path, dict], tmp_path: Path) -> None:
    workdir = copy_of(finished, tmp_path / "w")
    written = _written(workdir)
    code, plan, stderr = run_agent(workdir, "plan", "--run", "tiny")
    assert code == 0, stderr[-3000:]
    assert plan["data"]["tokens_source"] == "counted: the 200 prepared rows"
    assert plan["hidden_states"]["dtype"] == "float32"
    projected = plan["modes"]["offline"]["hidden_state_bytes_on_disk"]
    assert abs(projected - written) <= 0.05 * written, (projected, written)
    # the rates come from this run's own jobs on this host: the extraction's and the trainer's
    assert plan["rates"]["extract"]["source"].startswith("measured") and plan["rates"]["extract"]["tokens_per_s"]
    assert plan["rates"]["train"]["source"].startswith("measured") and plan["modes"]["offline"]["total_s"] > 0

    # the doctor's resources check projects the same bytes (it once assumed bf16: 26 MB for 32.6 MiB written)
    code, doctor, stderr = run_agent(workdir, "doctor", "--run", "tiny", "--checks", "resources")
    storage = next(f for f in doctor["findings"] if f["where"].endswith("hidden_states"))
    assert storage["result"] == "ok" and f"need up to {human(projected)}" in storage["why"], storage

    # before anything is prepared, the plan samples the data with the run's template: still within 5%
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copytree(REPO / "runs", fresh / "runs")
    code, early, stderr = run_agent(fresh, "plan", "--run", "tiny")
    assert code == 0, stderr[-3000:]
    assert early["data"]["tokens_source"].startswith("estimated")
    estimated = early["modes"]["offline"]["hidden_state_bytes_on_disk"]
    assert abs(estimated - written) <= 0.05 * written, (estimated, written)
