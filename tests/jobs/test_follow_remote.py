"""Jobs over a real sshd: they outlive the connection, and following a log survives the server
dropping the connection mid-stream, printing every line exactly once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from remote.inventory import Host, load_inventory
from remote.jobs import follow_log, job_call, mirror_path
from remote.ssh import open_connection
from specops.contract import commandline
from tests.support.agent import Agent, python_job, wait_until
from tests.support.sshd import SshServer

pytestmark = pytest.mark.ssh

LINES = 120
# Numbered lines at a steady pace, so a drop lands mid-stream; then waits for the gate.
COUNTER = python_job("""
import os, sys, time
for number in range(1, int(sys.argv[1]) + 1):
    print(f"line {number}", flush=True)
    time.sleep(0.02)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.02)
print("finished", flush=True)
""", str(LINES))


@pytest.fixture
def loop_host(inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    monkeypatch.setenv("SPECOPS_LOGS", str(tmp_path / "logs"))
    yield load_inventory(inventory).host("loop")
    Agent(tmp_path / "loop-workdir").clean_up()


def launch(host: Host, gate: Path) -> dict:
    with open_connection(host) as conn:
        argv = commandline.job_launch(name="counter", command=[*COUNTER, str(gate)], run="tiny")
        return job_call(conn, host, argv)["job"]


def test_a_job_outlives_its_connection_and_its_log_keeps_growing(loop_host: Host, tmp_path: Path) -> None:
    job = launch(loop_host, tmp_path / "gate")
    log = Path(job["log"])
    size_then = wait_until(lambda: log.stat().st_size, what="the first output")
    with open_connection(loop_host) as conn:
        again = job_call(conn, loop_host, commandline.job_show(job=job["id"]))["job"]
    assert again["state"] == "running"
    wait_until(lambda: log.stat().st_size > size_then, what="the log to grow after reconnecting")


def test_follow_survives_the_server_dropping_the_connection(loop_host: Host, sshd: SshServer,
                                                            tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    job = launch(loop_host, gate)
    received: list[str] = []
    notices: list[str] = []
    dropped: list[int] = []

    def on_text(text: str) -> None:
        received.append(text)
        seen = "".join(received)
        if "line 20\n" in seen and not dropped:
            dropped.append(sshd.drop_connections())  # kills the per-connection sshd children
        if f"line {LINES}\n" in seen:
            gate.touch()

    outcome = follow_log(loop_host, job["id"], 0, on_text, on_notice=notices.append)

    expected = "".join(f"line {number}\n" for number in range(1, LINES + 1)) + "finished\n"
    assert "".join(received) == expected
    assert dropped[0] >= 1 and outcome.reconnects >= 1 and notices
    assert outcome.state == "succeeded" and outcome.exit_code == 0 and not outcome.interrupted
    assert outcome.mirror == mirror_path(loop_host, job["id"])
    assert outcome.mirror.read_text() == Path(job["log"]).read_text() == expected


def test_ctrl_c_stops_following_and_leaves_the_job_running(loop_host: Host, tmp_path: Path) -> None:
    job = launch(loop_host, tmp_path / "gate")

    def on_text(text: str) -> None:
        raise KeyboardInterrupt

    outcome = follow_log(loop_host, "counter", None, on_text)
    assert outcome.interrupted and outcome.job_id == job["id"]
    with open_connection(loop_host) as conn:
        assert job_call(conn, loop_host, commandline.job_show(job=job["id"]))["job"]["state"] == "running"


def test_lines_shows_the_end_and_resumes_the_mirror_where_it_left_off(loop_host: Host, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    job = launch(loop_host, gate)
    with open_connection(loop_host) as conn:
        shown_argv = commandline.job_show(job=job["id"])
        wait_until(lambda: job_call(conn, loop_host, shown_argv)["job"]["state"] == "succeeded",
                   what="the job to finish")
    shown: list[str] = []
    outcome = follow_log(loop_host, job["id"], None, shown.append, lines=2, follow=False)
    assert "".join(shown) == f"line {LINES}\nfinished\n"
    assert outcome.mirror.read_text() == Path(job["log"]).read_text()
    again: list[str] = []
    follow_log(loop_host, job["id"], None, again.append, lines=1)
    assert "".join(again) == "finished\n"
    assert outcome.offset == len(Path(job["log"]).read_bytes())
