"""`invoke stop` without --job: the run's one running job is stopped (and it says which); several are
listed and nothing is stopped (exit 2)."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import Cli

pytestmark = pytest.mark.ssh

SLEEPER = ["sh", "-c", "echo up; sleep 600"]


def _launch(cli: Cli, host: str, name: str) -> str:
    launched = cli("run", "--host", host, "--name", name, "--run", "r1", "--json", "--", *SLEEPER)
    assert launched.exit_code == 0, launched.stderr
    return launched.json()["job"]["id"]


def _states(cli: Cli, host: str) -> dict[str, str]:
    return {job["id"]: job["state"] for job in cli("status", "--host", host, "--json", "--all").json()["jobs"]}


def test_stop_without_job_stops_the_one_running_job_of_the_run_and_says_so(cli: Cli, host_name: str) -> None:
    job_id = _launch(cli, host_name, "train")
    result = cli("stop", "--host", host_name, "--run", "r1")
    assert result.exit_code == 0, result.stderr
    assert f"stopping {job_id}: the one running job of run r1" in result.stderr
    assert f"job {job_id} stopped" in result.stdout
    assert _states(cli, host_name)[job_id] == "stopped"


def test_stop_without_job_lists_several_running_jobs_and_stops_none(cli: Cli, host_name: str) -> None:
    first, second = _launch(cli, host_name, "train"), _launch(cli, host_name, "vllm-server")
    try:
        result = cli("stop", "--host", host_name, "--run", "r1", "--json")
        assert result.exit_code == 2
        assert len(result.stderr.strip().splitlines()) == 1
        assert first in result.stderr and second in result.stderr and "choose one with --job" in result.stderr
        assert json.loads(result.stdout)["ok"] is False
        states = _states(cli, host_name)
        assert states[first] == "running" and states[second] == "running"
    finally:
        for job_id in (first, second):
            cli("stop", "--host", host_name, "--job", job_id)


def test_stop_without_job_when_nothing_of_the_run_runs_is_bad_input(cli: Cli) -> None:
    result = cli("stop", "--host", "local", "--run", "r1")
    assert result.exit_code == 2 and "no job of run r1 is running on local" in result.stderr
