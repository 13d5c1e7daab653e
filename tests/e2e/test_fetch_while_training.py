"""`invoke fetch` while training runs, over the real sshd: a consistent snapshot every time.

The newest finished checkpoint (and the run says which epoch), every file checked after transfer
against the sha256 the host computed, and the growing train.log brought home up to a recorded
offset: a prefix of the host's log, whole lines, with the metrics table read from that same prefix.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from tests.support.cli import Cli
from tests.support.repo import REPO
from tests.support.runs import from_source_conversations

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

HOST = "loop"


def _job_state(cli: Cli, job_id: str) -> str:
    jobs = {job["id"]: job for job in cli("status", "--host", HOST, "--json", "--all").json()["jobs"]}
    return jobs[job_id]["state"]


def test_fetch_while_training_runs_brings_home_a_consistent_snapshot(cli: Cli, tmp_path: Path) -> None:
    # the demo run with fewer rows and many epochs: checkpoints come often and training outlasts the
    # fetches however busy the machine (each fetch is a few agent calls; the job is stopped after the third,
    # so epochs it never reaches cost nothing); on the dataset's own answers (no regenerate, no evaluate)
    runs = tmp_path / "my-runs"
    runs.mkdir()
    config = yaml.safe_load((REPO / "runs" / "tiny.yaml").read_text())
    config["samples"], config["train"]["epochs"] = 40, 400
    (runs / "tiny.yaml").write_text(yaml.safe_dump(config))
    from_source_conversations(runs / "tiny.yaml")
    env = {"SPECOPS_RUNS_DIR": str(runs)}
    fetched = tmp_path / "fetched"
    checkpoints = tmp_path / "loop-workdir" / "runs" / "tiny" / "checkpoints"

    launched = cli("pipeline", "--host", HOST, "--detach", "--skip-doctor", "--no-fetch", **env)
    assert launched.exit_code == 0, launched.stderr
    job_id = launched.stdout.strip()  # --detach prints the job's id
    try:
        _fetch_while_it_trains(cli, job_id, checkpoints, fetched, env)
    finally:
        cli("stop", "--host", HOST, "--job", job_id)


def _fetch_while_it_trains(cli: Cli, job_id: str, checkpoints: Path, fetched: Path, env: dict[str, str]) -> None:
    host_log = checkpoints / "train.log"
    deadline = time.monotonic() + 900
    while not (checkpoints / "epoch0_end").is_symlink():
        assert time.monotonic() < deadline, "training never finished its first epoch"
        assert _job_state(cli, job_id) in ("running", "pending"), _job_state(cli, job_id)
        time.sleep(1)
    fetched_while_running: list[dict] = []
    deadline = time.monotonic() + 600
    while len(fetched_while_running) < 3:
        assert time.monotonic() < deadline, f"only {len(fetched_while_running)} fetches while training ran"
        whole_lines_before = host_log.read_bytes().rfind(b"\n") + 1
        finished_before = max(int(link.name[5:].split("_")[0]) for link in checkpoints.glob("epoch*_end"))
        result = cli("fetch", "--host", HOST, "--json", timeout=300, SPECOPS_FETCHED=str(fetched), **env)
        assert result.exit_code == 0, result.stdout + result.stderr
        document = result.json()
        state = _job_state(cli, job_id)
        assert state in ("running", "pending", "succeeded"), state

        home = fetched / HOST / "tiny"
        epoch = document["epoch"]
        assert epoch >= finished_before  # the newest finished checkpoint, never an older one
        assert document["checkpoint"] in (f"epoch{epoch}_end", "checkpoint_best")
        assert json.loads((home / "checkpoint" / "training_state.json").read_text())["epoch"] == epoch
        assert (home / "checkpoint" / "model.safetensors").is_file()
        offset = document["logs"]["train.log"]["offset"]
        brought = (home / "train.log").read_bytes()
        assert len(brought) == offset >= whole_lines_before and brought.endswith(b"\n")
        assert host_log.read_bytes()[:offset] == brought  # a prefix of the host's (still growing) log
        table = json.loads((home / "metrics.json").read_text())
        assert table["log"].endswith("train.log") and table["epochs"] == document["metrics"]
        assert not list((checkpoints.parent / "fetch").iterdir())  # the host's snapshot was dropped
        if state in ("running", "pending") and host_log.stat().st_size > offset:
            fetched_while_running.append(document)  # the log grew past what was fetched: truly mid-training
        elif state == "succeeded":
            pytest.fail("training ended before three fetches happened during it")
    offsets = [document["logs"]["train.log"]["offset"] for document in fetched_while_running]
    assert offsets == sorted(offsets)  # each snapshot reaches at least as far into the log as the one before
