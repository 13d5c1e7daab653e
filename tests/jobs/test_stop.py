"""`job stop`: the whole process group ends, even children that ignore SIGHUP; the job reads `stopped`."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from tests.support.agent import Agent, group_alive, python_job

# A shell whose background child ignores SIGHUP and SIGTERM (ignored signals survive exec).
STUBBORN = ["sh", "-c", 'trap "" HUP TERM; sleep 1000 & echo "child $!"; wait']


def _pid_alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


def test_stop_kills_the_process_group_including_a_child_that_ignores_sighup(agent: Agent) -> None:
    job = agent.launch("train", STUBBORN)
    child_pid = int(re.search(r"child (\d+)", agent.wait_for_log(job, "child ")).group(1))
    assert job["pgid"] and _pid_alive(child_pid)

    stopped = agent.ok("stop", job["id"], "--grace", "0.5")
    assert stopped["signal"] == "SIGKILL" and stopped["already_ended"] is False
    assert stopped["job"]["state"] == "stopped" and stopped["job"]["ended"]
    assert not group_alive(job["pgid"]) and not _pid_alive(child_pid)
    assert agent.tmux(job["tmux_server"], "has-session", "-t", f"={job['id']}").returncode != 0
    assert agent.record_on_disk(job["id"])["state"] == "stopped"


def test_a_job_that_obeys_sigterm_is_stopped_within_the_grace_period(agent: Agent) -> None:
    job = agent.launch("vllm-server", python_job("import time; print('serving', flush=True); time.sleep(1000)"))
    agent.wait_for_log(job, "serving")
    stopped = agent.ok("stop", "vllm-server", "--grace", "20")
    assert stopped["signal"] == "SIGTERM"
    assert stopped["job"]["state"] == "stopped" and stopped["job"]["exit_code"] == 143
    assert not group_alive(job["pgid"])


def test_stopping_a_job_that_already_ended_changes_nothing(agent: Agent) -> None:
    job = agent.launch("extract", python_job("print('done')"))
    agent.wait_for_state(job["id"])
    answer = agent.ok("stop", job["id"])
    assert answer["already_ended"] is True and answer["signal"] is None
    assert answer["job"]["state"] == "succeeded" and answer["job"]["exit_code"] == 0



# torchrun's way: each worker leads a session of its own; this one also ignores SIGTERM, like a trainer
# stuck in a collective whose peer was cut off.
LAUNCHER = """
import signal, subprocess, sys
worker = subprocess.Popen([sys.executable, "-c",
                           "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1000)"],
                          start_new_session=True)
print(f"worker {worker.pid}", flush=True)
worker.wait()
"""


def test_stop_reaches_a_worker_that_started_a_session_of_its_own(agent: Agent) -> None:
    job = agent.launch("train", python_job(LAUNCHER))
    worker_pid = int(re.search(r"worker (\d+)", agent.wait_for_log(job, "worker ")).group(1))
    try:
        assert _pid_alive(worker_pid) and os.getpgid(worker_pid) != job["pgid"]
        stopped = agent.ok("stop", job["id"], "--grace", "0.5")
        assert stopped["signal"] == "SIGKILL" and stopped["job"]["state"] == "stopped"
        assert not group_alive(job["pgid"]) and not _pid_alive(worker_pid)
    finally:
        if _pid_alive(worker_pid):  # outside the job's group: the fixture's clean-up would miss it
            os.kill(worker_pid, signal.SIGKILL)


def test_a_group_this_process_started_ends_by_sigterm_without_waiting_for_its_own_reaping() -> None:
    import subprocess

    from specops.jobs import processes

    # the wrapper stopping the child it just started, or a caller of stop_server: the ended leader is
    # this process's zombie until it waits, so waiting for it to be reaped could only time out
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert processes.terminate_group(child.pid, grace_s=30) == "SIGTERM"
    finally:
        child.kill()
        assert child.wait(timeout=10) == -signal.SIGTERM
