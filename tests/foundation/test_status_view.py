"""`invoke status` reads like a person's summary: an ended job's own result (from its JSON document), then
the last human line of the log (never a fragment of the step's JSON result) and, when a signal ended the
job, the signal's name beside the exit code."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import Cli

pytestmark = pytest.mark.ssh

# A step's way of ending its log: a human line, then its one-line JSON result of a few KB.
RESULT = json.dumps({"ok": True, "steps": {f"step{index}": {"status": "done", "detail": "x" * 40}
                                           for index in range(60)}})


def _row(cli: Cli, host: str, job_id: str) -> str:
    shown = cli("status", "--host", host, "--all")
    assert shown.exit_code == 0, shown.stderr
    return next(line for line in shown.stdout.splitlines() if job_id in line)


def test_status_shows_the_last_human_line_not_the_json_result(cli: Cli, host_name: str) -> None:
    script = f"print('trained 3 epochs, loss 1.25'); print({RESULT!r})"
    launched = cli("run", "--host", host_name, "--name", "step", "--", "python3", "-c", script)
    assert launched.exit_code == 0, launched.stderr
    job = next(job for job in cli("status", "--host", host_name, "--json").json()["jobs"] if job["name"] == "step")
    assert job["last_log_line"] == "trained 3 epochs, loss 1.25"
    assert job["result"] == "pipeline: 60 done"  # the job's own result (issue 46), from its JSON document
    shown = cli("status", "--host", host_name, "--all").stdout.splitlines()
    at = next(index for index, line in enumerate(shown) if job["id"] in line)
    assert "pipeline: 60 done" in shown[at] and "trained 3 epochs, loss 1.25" in shown[at + 1]
    assert not any('"' in line or "{" in line for line in shown[at:at + 2])


def test_status_names_the_signal_that_ended_a_job(cli: Cli, host_name: str) -> None:
    launched = cli("run", "--host", host_name, "--name", "killed", "--", "sh", "-c", "echo going; kill -KILL $$")
    assert launched.exit_code == 1
    job = next(job for job in cli("status", "--host", host_name, "--json").json()["jobs"] if job["name"] == "killed")
    assert job["exit_code"] == 137 and job["signal"] == "SIGKILL"
    assert "137 (SIGKILL)" in _row(cli, host_name, job["id"])
