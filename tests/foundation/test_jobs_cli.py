"""`invoke run/status/logs/stop` drive jobs under tmux on the host, over SSH and locally."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.agent import wait_until
from tests.support.cli import Cli, CliResult

pytestmark = pytest.mark.ssh

TRICKY = ["a b", "$HOME", "x;y", "`id`", "it's", 'say "hi"', "*"]


def _wait_state(cli: Cli, host: str, job_id: str, wanted: set[str], timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = {job["id"]: job for job in cli("status", "--host", host, "--json", "--all").json()["jobs"]}
        if jobs.get(job_id, {}).get("state") in wanted:
            return jobs[job_id]
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} never reached {wanted}")


def test_run_follows_the_job_and_arguments_arrive_literally(cli: Cli, host_name: str) -> None:
    script = "import json, sys; print(json.dumps(sys.argv[1:]))"
    result = cli("run", "--host", host_name, "--", "python3", "-c", script, *TRICKY)
    assert result.exit_code == 0, result.stderr
    assert json.dumps(TRICKY) in result.stdout  # the job's log line: stdout; specops' own words: stderr
    assert "succeeded (exit code 0)" in result.stderr


def test_a_failing_job_records_its_exit_code_and_fails_the_task(cli: Cli, host_name: str) -> None:
    result = cli("run", "--host", host_name, "--name", "boom", "--", "sh", "-c", "echo going down; exit 7")
    assert result.exit_code == 1
    assert "failed (exit code 7)" in result.stderr
    jobs = cli("status", "--host", host_name, "--json").json()["jobs"]
    boom = next(job for job in jobs if job["name"] == "boom")
    assert boom["state"] == "failed" and boom["exit_code"] == 7 and boom["last_log_line"] == "going down"


def test_detach_then_logs_then_stop(cli: Cli, host_name: str) -> None:
    launched = cli("run", "--host", host_name, "--name", "ticker", "--json", "--",
                   "sh", "-c", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done")
    assert launched.exit_code == 0, launched.stderr
    job_id = launched.json()["job"]["id"]
    _wait_state(cli, host_name, job_id, {"running"})

    def two_ticks() -> CliResult | None:  # a condition, not a fixed sleep: the log has grown by two lines
        result = cli("logs", "--host", host_name, "--job", job_id, "--lines", "2")
        return result if result.exit_code == 0 and "tick 1" in result.stdout else None

    tail = wait_until(two_ticks, what="two ticks in the job's log")
    assert tail.exit_code == 0 and "tick" in tail.stdout
    stopped = cli("stop", "--host", host_name, "--job", "ticker", "--json")
    assert stopped.exit_code == 0, stopped.stderr
    assert stopped.json()["job"]["state"] == "stopped"
    assert _wait_state(cli, host_name, job_id, {"stopped"})["processes_alive"] is False


def test_run_without_a_command_is_bad_input(cli: Cli) -> None:
    result = cli("run", "--host", "local")
    assert result.exit_code == 2 and "give the command after --" in result.stderr
