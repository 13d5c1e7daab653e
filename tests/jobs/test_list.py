"""`job list` and `job show`: states refreshed, age, exit code, last log line, GPUs when present."""

from __future__ import annotations

import shutil

from tests.support.agent import Agent, python_job


def test_list_shows_the_newest_of_each_kind_and_everything_with_all(agent: Agent) -> None:
    old = agent.launch("extract", python_job("print('first')"))
    agent.wait_for_state(old["id"])
    new = agent.launch("extract", python_job("print('second'); print('  '); print('last words')"))
    agent.wait_for_state(new["id"])
    running = agent.launch("train", python_job("import time; print('step 1', flush=True); time.sleep(1000)"))
    agent.wait_for_log(running, "step 1")

    listing = agent.ok("list")
    by_id = {job["id"]: job for job in listing["jobs"]}
    assert set(by_id) == {new["id"], running["id"]}
    assert by_id[new["id"]]["state"] == "succeeded" and by_id[new["id"]]["exit_code"] == 0
    assert by_id[new["id"]]["last_log_line"] == "last words"
    assert by_id[running["id"]]["state"] == "running" and by_id[running["id"]]["exit_code"] is None
    assert by_id[running["id"]]["last_log_line"] == "step 1"
    assert all(job["age_s"] >= 0 for job in listing["jobs"])
    assert "gpus" in listing and (listing["gpus"] is None) == (shutil.which("nvidia-smi") is None)

    everything = agent.ok("list", "--all")["jobs"]
    assert [job["id"] for job in everything] == [old["id"], new["id"], running["id"]]


def test_show_by_name_is_the_newest_job_of_that_name(agent: Agent) -> None:
    old = agent.launch("extract", python_job("pass"))
    agent.wait_for_state(old["id"])
    new = agent.launch("extract", python_job("pass"))
    assert agent.show("extract")["id"] == new["id"]
    assert agent.show(old["id"])["id"] == old["id"]
    code, document = agent.call("show", "../../etc/passwd")
    assert code == 2 and document["ok"] is False
