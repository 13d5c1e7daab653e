"""`invoke stop` without --job stops the run: its one running job (and it says which), or every running job
of it, its steps first and then its services (issue 51: a pipeline and the vLLM server it started), each named."""

from __future__ import annotations

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


def test_stop_without_job_stops_the_runs_step_then_the_server_it_started(cli: Cli, host_name: str) -> None:
    step, server = _launch(cli, host_name, "pipeline"), _launch(cli, host_name, "vllm-server")
    try:
        result = cli("stop", "--host", host_name, "--run", "r1", "--json")
        assert result.exit_code == 0, result.stderr
        document = result.json()
        assert [entry["job"]["id"] for entry in document["stopped"]] == [step, server]  # the step first
        assert all(entry["job"]["state"] == "stopped" for entry in document["stopped"])
        states = _states(cli, host_name)
        assert states[step] == "stopped" and states[server] == "stopped"
    finally:
        for job_id in (step, server):
            cli("stop", "--host", host_name, "--job", job_id)


def test_stopping_a_run_says_what_became_of_each_job(cli: Cli, host_name: str) -> None:
    step, server = _launch(cli, host_name, "extract"), _launch(cli, host_name, "vllm-server")
    result = cli("stop", "--host", host_name, "--run", "r1")
    assert result.exit_code == 0, result.stderr
    assert "stopping every running job of run r1: its steps, then its services" in result.stderr
    assert result.stdout.splitlines() == [f"job {step} stopped (SIGTERM); state stopped (extract)",
                                          f"job {server} stopped (SIGTERM); state stopped (vllm-server)"]


def test_stop_without_job_when_nothing_of_the_run_runs_is_bad_input(cli: Cli) -> None:
    result = cli("stop", "--host", "local", "--run", "r1")
    assert result.exit_code == 2 and "no job of run r1 is running on local" in result.stderr
