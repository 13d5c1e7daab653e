"""Streams: a job's log lines go to stdout on every path of `invoke logs`; specops' own words to stderr."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import Cli

pytestmark = pytest.mark.ssh

LINES = "for i in 1 2 3; do echo line $i; done"


def _finished_job(cli: Cli, host: str) -> str:
    launched = cli("run", "--host", host, "--name", "lines", "--", "sh", "-c", LINES)
    assert launched.exit_code == 0, launched.stderr
    return next(job["id"] for job in cli("status", "--host", host, "--json").json()["jobs"] if job["name"] == "lines")


def test_logs_and_logs_follow_both_write_the_log_to_stdout(cli: Cli, host_name: str) -> None:
    job_id = _finished_job(cli, host_name)
    for args in ((), ("--follow",)):
        result = cli("logs", "--host", host_name, "--job", job_id, *args)
        assert result.exit_code == 0, result.stderr
        assert result.stdout.splitlines() == ["line 1", "line 2", "line 3"], args
        assert "line 1" not in result.stderr, args
    followed = cli("logs", "--host", host_name, "--job", job_id, "--follow")
    assert f"job {job_id}: succeeded (exit code 0)" in followed.stderr  # specops' own message, not in stdout
    assert "succeeded" not in followed.stdout


def test_logs_json_is_one_document_with_the_lines_and_the_state(cli: Cli, host_name: str) -> None:
    job_id = _finished_job(cli, host_name)
    for args in ((), ("--follow",)):
        result = cli("logs", "--host", host_name, "--job", job_id, "--json", "--lines", "2", *args)
        assert result.exit_code == 0, result.stderr
        document = json.loads(result.stdout)
        assert document["job"] == job_id and document["host"] == host_name
        assert document["lines"] == ["line 2", "line 3"], args
        assert document["state"] == "succeeded" and document["exit_code"] == 0


def test_logs_json_of_a_host_without_jobs_is_still_one_document(cli: Cli) -> None:
    result = cli("logs", "--host", "local", "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout) == {"ok": False, "error": "logs: no jobs on local", "exit_code": 2}
