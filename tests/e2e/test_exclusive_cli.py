"""A run's steps are exclusive on a host, through the real `invoke`, on `local` and over the real sshd.

The first `invoke prepare` is held still mid-step (SIGSTOP of its job's process group) so that the
second arrives while it runs, every time: the second is refused with one line naming the first (exit 2)
and writes nothing; the first, continued, ends with the same files as the step run alone. `--wait`
queues behind the holder and then runs. Reading the host (status, logs) is never blocked.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import yaml

from specops.contract.protocol import TERMINAL_STATES
from tests.support.agent import wait_until
from tests.support.cli import Cli
from tests.support.repo import REPO

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

SAMPLES = "8"


def _quick_runs(tmp_path: Path) -> dict[str, str]:
    """The tiny run without regeneration or evaluation: prepare alone is the step under test."""
    runs = tmp_path / "my-runs"
    runs.mkdir()
    config = yaml.safe_load((REPO / "runs" / "tiny.yaml").read_text())
    config["regenerate"]["enabled"] = False
    config["evaluate"]["enabled"] = False
    (runs / "tiny.yaml").write_text(yaml.safe_dump(config))
    return {"SPECOPS_RUNS_DIR": str(runs)}


def _record(workdir: Path, job_id: str) -> dict:
    return json.loads((workdir / "state" / "jobs" / f"{job_id}.json").read_text())


def _job_ids(workdir: Path) -> set[str]:
    return {path.stem for path in (workdir / "state" / "jobs").glob("*.json") if ".environ" not in path.name}


def _files(run_dir: Path) -> dict[str, str]:
    """Every file of the run and its sha256, but the manifest (it records when each step ran)."""
    return {path.relative_to(run_dir).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(run_dir.rglob("*")) if path.is_file() and path.name != "manifest.json"}


def _hold_still(workdir: Path, pgid: int) -> None:
    """SIGSTOP the step's group while this test holds the host's jobs lock: the step is then stopped in
    its own work, never inside that lock (where it would stop every other launch on the host with it)."""
    handle = os.open(workdir / "state" / "jobs" / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        os.killpg(pgid, signal.SIGSTOP)
    finally:
        os.close(handle)


def _ended(workdir: Path, job_id: str) -> dict:
    return wait_until(lambda: (record := _record(workdir, job_id))["state"] in TERMINAL_STATES and record,
                      timeout_s=600, what=f"job {job_id} to end")


def test_a_second_step_of_a_running_run_is_refused_and_the_first_ends_as_if_alone(
        cli: Cli, tmp_path: Path, host_name: str) -> None:
    env = _quick_runs(tmp_path)
    workdir = tmp_path / f"{host_name}-workdir"
    run_dir = workdir / "runs" / "tiny"
    launched = cli("prepare", "--host", host_name, "--samples", SAMPLES, "--detach", "--json", timeout=300, **env)
    assert launched.exit_code == 0, launched.stderr[-3000:]
    first = launched.json()["job"]["id"]
    pgid = wait_until(lambda: _record(workdir, first).get("pgid"), what="the first step's process")
    _hold_still(workdir, pgid)  # the first step, held mid-way: the second arrives while it runs
    try:
        assert _record(workdir, first)["state"] == "running"
        files, jobs = _files(run_dir), _job_ids(workdir)
        for second in (["prepare", "--samples", "4"], ["train", "--skip-doctor"]):
            refused = cli(*second, "--host", host_name, timeout=300, **env)
            lines = refused.stderr.strip().splitlines()
            assert refused.exit_code == 2 and len(lines) == 1, refused.stderr
            assert f"job {first} (prepare)" in lines[0] and "--wait" in lines[0]
        assert _files(run_dir) == files and _job_ids(workdir) == jobs  # nothing written, no job made

        status = cli("status", "--host", host_name, "--json", **env)  # reading is never blocked
        assert status.exit_code == 0 and first in {job["id"] for job in status.json()["jobs"]}
        assert cli("logs", "--host", host_name, "--job", first, "--json", **env).exit_code == 0
    finally:
        os.killpg(pgid, signal.SIGCONT)
    assert _ended(workdir, first)["state"] == "succeeded"
    together = _files(run_dir)
    assert any(name.startswith("prepared/") for name in together)

    shutil.rmtree(run_dir)  # the same step again, alone
    alone = cli("prepare", "--host", host_name, "--samples", SAMPLES, "--json", timeout=600, **env)
    assert alone.exit_code == 0, alone.stderr[-3000:]
    assert _files(run_dir) == together


def test_wait_queues_the_second_step_behind_the_first_then_runs_it(cli: Cli, tmp_path: Path) -> None:
    env = _quick_runs(tmp_path)
    workdir = tmp_path / "local-workdir"
    launched = cli("prepare", "--host", "local", "--samples", SAMPLES, "--detach", "--json", timeout=300, **env)
    assert launched.exit_code == 0, launched.stderr[-3000:]
    first = launched.json()["job"]["id"]
    pgid = wait_until(lambda: _record(workdir, first).get("pgid"), what="the first step's process")
    _hold_still(workdir, pgid)
    try:
        queued = cli("vocab", "--host", "local", "--wait", "--detach", "--json", timeout=300, **env)
        assert queued.exit_code == 0, queued.stderr[-3000:]
        second = queued.json()["job"]["id"]
        waiting = wait_until(lambda: _record(workdir, second).get("waiting_for"), what="the second to queue")
        assert waiting == f"job {first} (prepare)" and _record(workdir, second)["state"] == "pending"
    finally:
        os.killpg(pgid, signal.SIGCONT)
    assert _ended(workdir, first)["state"] == "succeeded"
    vocab = _ended(workdir, second)
    assert vocab["state"] == "succeeded", Path(vocab["log"]).read_text()[-3000:]
    assert f"waiting for job {first} (prepare)" in Path(vocab["log"]).read_text()
    assert vocab["started"] >= _record(workdir, first)["ended"]  # it ran after the first, not beside it
