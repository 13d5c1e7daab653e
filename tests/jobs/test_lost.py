"""A job whose tmux session vanished without an exit code is `lost` (persisted), never `running`."""

from __future__ import annotations

from tests.support.agent import Agent, group_alive, python_job, wait_until

SLEEPER = python_job("import time; print('up', flush=True); time.sleep(1000)")


def test_a_session_killed_from_outside_reads_lost_and_the_record_says_so(agent: Agent) -> None:
    job = agent.launch("extract", SLEEPER)
    agent.wait_for_log(job, "up")
    assert agent.tmux(job["tmux_server"], "kill-session", "-t", f"={job['id']}").returncode == 0

    listed = {entry["id"]: entry for entry in agent.ok("list")["jobs"]}
    assert listed[job["id"]]["state"] == "lost" and listed[job["id"]]["exit_code"] is None
    assert agent.record_on_disk(job["id"])["state"] == "lost"
    # The command ran in its own process group, so it outlived the session: say so, and let stop end it.
    assert listed[job["id"]]["processes_alive"] is True
    stopped = agent.ok("stop", job["id"], "--grace", "10")
    assert stopped["job"]["state"] == "stopped" and not group_alive(job["pgid"])


def test_a_lost_job_does_not_block_a_new_launch(agent: Agent) -> None:
    job = agent.launch("extract", SLEEPER)
    agent.wait_for_log(job, "up")
    agent.tmux(job["tmux_server"], "kill-session", "-t", f"={job['id']}")
    replacement = agent.launch("extract", SLEEPER)
    assert replacement["state"] == "running"
    assert agent.show(job["id"])["state"] == "lost"


def test_a_session_whose_name_extends_the_jobs_does_not_keep_it_alive(agent: Agent) -> None:
    job = agent.launch("extract", SLEEPER)
    agent.wait_for_log(job, "up")  # running for sure, so only the session's fate is under test
    server = job["tmux_server"]
    impostor = f"{job['id']}-2"
    # The impostor first: a tmux server whose last session is killed exits, and a new-session racing
    # that exit fails with "server exited unexpectedly" (seen under load).
    assert agent.tmux(server, "new-session", "-d", "-s", impostor, "sleep", "1000").returncode == 0
    assert agent.tmux(server, "kill-session", "-t", f"={job['id']}").returncode == 0
    # A bare target would match the impostor by prefix: the trap this test guards against.
    assert agent.tmux(server, "has-session", "-t", job["id"]).returncode == 0
    assert agent.show(job["id"])["state"] == "lost"


def test_a_job_that_ends_normally_is_never_reported_lost(agent: Agent) -> None:
    # Its session closes right after the exit is recorded; status checks racing it must see the exit.
    job = agent.launch("quick", python_job("print('bye')"))
    states = set()
    wait_until(lambda: states.add(state := agent.show(job["id"])["state"]) or state != "running",
               what="the quick job to end")
    assert agent.wait_for_state(job["id"])["state"] == "succeeded"
    assert "lost" not in states
