"""`job launch`: a record, a private tmux session, the exit recorded, one job per name (and one per run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specops.jobs.tmux import TmuxServer
from tests.support.agent import Agent, python_job

SLEEPER = python_job("import time; print('up', flush=True); time.sleep(1000)")


def test_a_job_that_succeeds_records_exit_code_zero_and_its_times(agent: Agent) -> None:
    job = agent.launch("extract", python_job("print('hello from the job')"), "--run", "tiny",
                       "--revision", '{"commit": "abc123", "dirty": false}', "--meta", '{"skip_doctor": true}')
    assert job["name"] == "extract" and job["run"] == "tiny"
    assert job["id"].startswith("extract-") and job["tmux_session"] == job["id"]

    done = agent.wait_for_state(job["id"])
    assert done["state"] == "succeeded" and done["exit_code"] == 0
    assert done["created"] <= done["started"] <= done["ended"]
    assert done["revision"] == {"commit": "abc123", "dirty": False} and done["meta"] == {"skip_doctor": True}
    assert Path(done["log"]) == agent.workdir / "logs" / f"{job['id']}.log"
    assert Path(done["log"]).read_text() == "hello from the job\n"
    assert agent.record_on_disk(job["id"])["state"] == "succeeded"


def test_a_job_that_fails_records_its_exit_code(agent: Agent) -> None:
    job = agent.launch("train", python_job("import sys; print('boom', file=sys.stderr); sys.exit(3)"))
    done = agent.wait_for_state(job["id"])
    assert done["state"] == "failed" and done["exit_code"] == 3
    assert done["last_log_line"] == "boom"


def test_a_command_that_does_not_exist_fails_like_a_shell_would(agent: Agent) -> None:
    job = agent.launch("typo", ["no-such-program-specops-test", "--flag"])
    done = agent.wait_for_state(job["id"])
    assert done["state"] == "failed" and done["exit_code"] == 127
    assert "no-such-program-specops-test" in Path(done["log"]).read_text()


def test_the_job_runs_in_a_tmux_session_on_the_workdirs_private_server(agent: Agent) -> None:
    job = agent.launch("server", SLEEPER)
    assert job["tmux_server"].startswith("specops-")
    assert agent.tmux(job["tmux_server"], "has-session", "-t", f"={job['id']}").returncode == 0
    assert agent.tmux("default", "has-session", "-t", f"={job['id']}").returncode != 0


def test_a_second_job_of_the_same_name_and_run_is_refused_with_the_running_ones_id(agent: Agent) -> None:
    first = agent.launch("extract", SLEEPER, "--run", "r1")
    code, refusal = agent.call("launch", "--name", "extract", "--run", "r1", "--", *SLEEPER)
    assert code == 2 and refusal["ok"] is False  # the run is busy (tests/jobs/test_run_lock.py)
    assert refusal["running_job"] == first["id"] and first["id"] in refusal["error"]
    assert len(agent.records_on_disk()) == 1  # nothing was created for the refused launch

    other_run = agent.launch("extract", SLEEPER, "--run", "r2")
    assert other_run["state"] == "running"

    agent.ok("stop", first["id"], "--grace", "5")
    again = agent.launch("extract", SLEEPER, "--run", "r1")
    assert again["id"] != first["id"] and again["state"] == "running"


def test_two_launches_racing_for_the_same_name_start_one_job(agent: Agent) -> None:
    racers = [agent.popen("launch", "--name", "extract", "--", *SLEEPER) for _ in range(3)]
    outcomes = [(racer.wait(timeout=60), json.loads(racer.communicate()[0])) for racer in racers]
    started = [document["job"]["id"] for code, document in outcomes if code == 0]
    refused = [document["running_job"] for code, document in outcomes if code == 1]
    assert len(started) == 1 and refused == [started[0]] * 2
    assert len(agent.records_on_disk()) == 1


TRICKY = ["with space", "it's", 'say "hi"', "$HOME", "$(touch pwned)", "a;touch pwned", "`touch pwned`",
          "back\\slash", "*", "", "-n", "--", "multi\nline"]


def test_arguments_with_shell_characters_arrive_literally(agent: Agent) -> None:
    name = "odd.name_1-x"  # every character a safe name may have (issue 12: names become file names)
    job = agent.launch(name, python_job("import json, sys; print(json.dumps(sys.argv[1:]))", *TRICKY),
                       "--env", "ODD=$HOME;`x`")
    done = agent.wait_for_state(job["id"])
    assert done["state"] == "succeeded", Path(done["log"]).read_text()
    assert json.loads(Path(done["log"]).read_text()) == TRICKY
    assert done["name"] == name and agent.show(name)["id"] == job["id"]
    assert not list(agent.workdir.rglob("pwned"))


def test_a_name_with_shell_characters_is_refused_and_nothing_runs(agent: Agent) -> None:
    name = "odd name; $(touch pwned) `x` 'q'"
    code, document = agent.call("launch", "--name", name, "--", "sh", "-c", "touch pwned")
    assert code == 2 and "safe name" in document["error"]
    assert agent.records_on_disk() == [] and not list(agent.workdir.rglob("pwned"))


def test_the_environment_is_the_launching_agents_not_the_tmux_servers(agent: Agent) -> None:
    # The first launch starts the tmux server, which keeps that client's environment for good.
    agent.launch("server", SLEEPER, agent_env={"SPECOPS_TEST_MARKER": "first"})
    show_env = python_job("import os; print(os.environ.get('SPECOPS_TEST_MARKER'), os.environ.get('EXPLICIT'))")
    job = agent.launch("probe", show_env, "--env", "EXPLICIT=given here", agent_env={"SPECOPS_TEST_MARKER": "second"})
    done = agent.wait_for_state(job["id"])
    assert Path(done["log"]).read_text() == "second given here\n"
    assert done["env"] == {"EXPLICIT": "given here"}
    assert not list((agent.workdir / "state" / "jobs").glob("*.environ.json"))  # used once, then removed


@pytest.mark.parametrize("arguments, complaint", [
    (["--name", "x", "--env", "NOEQUALS", "--", "true"], "--env"),
    (["--name", "x", "--env", "1BAD=v", "--", "true"], "--env"),
    (["--name", "x", "--meta", "[1, 2]", "--", "true"], "--meta"),
    (["--name", "x", "--revision", "{not json", "--", "true"], "--revision"),
    (["--name", "x", "--"], "no command"),
    (["--name", "", "--", "true"], "--name"),
    (["--", "true"], "--name"),
])
def test_bad_input_is_one_line_and_exit_2(agent: Agent, arguments: list[str], complaint: str) -> None:
    code, document = agent.call("launch", *arguments)
    assert code == 2 and document["ok"] is False
    assert complaint in document["error"] and "\n" not in document["error"]
    assert not (agent.workdir / "state" / "jobs").exists() or not agent.records_on_disk()


def test_a_session_started_as_the_servers_last_one_ends_is_started_on_a_fresh_server(tmp_path: Path) -> None:
    # The server exits when its last session ends; a new-session reaching it meanwhile is told
    # "server exited unexpectedly". Launching right after a job ends must not fail on that race.
    server = TmuxServer(tmp_path)
    try:
        for round_ in range(15):
            server.new_session(f"s{round_}", str(tmp_path), ["sleep", "1000"])
            assert server.kill_session(f"s{round_}")
            server.new_session(f"t{round_}", str(tmp_path), ["sleep", "1000"])
            assert server.has_session(f"t{round_}")
            assert server.kill_session(f"t{round_}")
    finally:
        server.kill_server()
