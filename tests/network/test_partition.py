"""A partitioned host is a prompt, clear error naming the host, never a hang; following a job's log
rides out a partition and, once the network heals, prints every line exactly once.

The host is an sshd in a network namespace; `partition()` drops all its packets with nftables, so
the control side sees what a dead link looks like: silence, no reset.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.network.conftest import CHANNEL_TIMEOUT, CONNECT_TIMEOUT, HOST, PYTHON, write_host_inventory
from tests.support.agent import wait_until
from tests.support.cli import Cli
from tests.support.netns import NetnsHost

DEAD_MESSAGE = f"no data from the host for {CHANNEL_TIMEOUT:g} s and no answer to keepalives (connection dead?)"

pytestmark = pytest.mark.ssh

# Slack for invoke's own start-up on a busy machine; a hang would be minutes (TCP gives up after ~15).
SLACK_S = 10.0

# Numbered lines at a steady pace until the gate file appears, then "finished": never quiet for long,
# so only a dead connection (not a quiet job) can stop the stream.
COUNTER = """
import os, sys, time
number = 0
while not os.path.exists(sys.argv[1]):
    number += 1
    print(f"line {number}", flush=True)
    time.sleep(0.05)
print("finished", flush=True)
"""

# The host's python, except that the agent's `job list` waits until the test releases it: the call
# is known to be in flight when the network is cut. Never waits more than a minute.
SLOW_PYTHON = """#!/bin/sh
case "$*" in
  *"job list"*)
    : > '{started}'
    i=0
    while [ ! -e '{release}' ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done ;;
esac
exec '{python}' "$@"
"""


def slow_host_cli(tmp_path: Path, network: NetnsHost, started: Path, release: Path) -> Cli:
    """The CLI for host `cut` whose python holds `job list` until `release` exists."""
    wrapper = tmp_path / "slow-python"
    wrapper.write_text(SLOW_PYTHON.format(started=started, release=release, python=PYTHON))
    wrapper.chmod(0o755)
    return Cli(write_host_inventory(tmp_path, network, python=str(wrapper)), tmp_path / "logs")


@pytest.fixture(params=["shared master", "own connection"])
def quick_env(request: pytest.FixtureRequest, control_dir: Path) -> dict[str, str]:
    """`invoke status` both ways: through a shared OpenSSH master, and on our own (fabric) connection."""
    if request.param == "shared master":
        return {"SPECOPS_SSH_CONTROL_DIR": str(control_dir)}
    return {"SPECOPS_SSH_PERSIST": "0"}


def where(network: NetnsHost) -> str:
    return f"{HOST} ({network.address}:{network.port})"


def test_the_host_answers_while_the_network_is_whole(cli: Cli, network: NetnsHost) -> None:
    result = cli("check", "--host", HOST, "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["host"] == HOST and result.json()["round_trips"] == 1


def test_check_across_a_partition_fails_within_the_connect_timeout_naming_the_host(
        cli: Cli, network: NetnsHost) -> None:
    with network.partitioned():
        started = time.monotonic()
        result = cli("check", "--host", HOST, "--json", timeout=120)
        elapsed = time.monotonic() - started
    assert result.exit_code == 1
    assert f"specops: {where(network)}: no answer within {CONNECT_TIMEOUT:g} s" in result.stderr
    assert "partitioned" in result.stderr
    assert elapsed < CONNECT_TIMEOUT + SLACK_S


def test_a_partition_during_an_agent_call_is_reported_as_a_dead_connection(
        tmp_path: Path, network: NetnsHost, quick_env: dict[str, str]) -> None:
    started, release = tmp_path / "call-started", tmp_path / "release"
    cli = slow_host_cli(tmp_path, network, started, release)
    call = cli.popen("status", "--host", HOST, "--json", **quick_env)
    try:
        wait_until(started.exists, what="the agent call to be running on the host")
        network.partition()
        cut = time.monotonic()
        release.touch()  # the agent answers now, into the partition
        _stdout, stderr = call.communicate(timeout=120)
        elapsed = time.monotonic() - cut
    finally:
        release.touch()
        network.heal()
        if call.poll() is None:
            call.kill()
            call.wait()
    assert call.returncode == 1, stderr
    assert f"specops: {where(network)}: {DEAD_MESSAGE}" in stderr
    assert elapsed < CHANNEL_TIMEOUT + SLACK_S


def test_a_quiet_agent_call_on_a_whole_network_is_not_a_dead_connection(
        tmp_path: Path, network: NetnsHost, quick_env: dict[str, str]) -> None:
    started, release = tmp_path / "call-started", tmp_path / "release"
    cli = slow_host_cli(tmp_path, network, started, release)
    call = cli.popen("status", "--host", HOST, "--json", **quick_env)
    try:
        wait_until(started.exists, what="the agent call to be running on the host")
        time.sleep(CHANNEL_TIMEOUT + 1)  # quiet, like an import of vLLM, on a healthy link
        release.touch()
        _stdout, stderr = call.communicate(timeout=120)
    finally:
        release.touch()
        if call.poll() is None:
            call.kill()
            call.wait()
    assert call.returncode == 0, stderr


class OutputReader:
    """Collects the lines of a process's output pipe as they come, from a thread."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def count(self, prefix: str) -> int:
        return sum(1 for line in list(self.lines) if line.startswith(prefix))

    def first(self, needle: str, start: int = 0) -> int | None:
        for index, line in enumerate(list(self.lines)[start:], start):
            if needle in line:
                return index
        return None

    def join(self) -> None:
        self._thread.join(timeout=10)


def test_following_a_log_survives_a_partition_and_prints_every_line_once(
        cli: Cli, network: NetnsHost, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    launched = cli("run", "--host", HOST, "--name", "counter", "--json", "--", PYTHON, "-c", COUNTER, str(gate))
    assert launched.exit_code == 0, launched.stderr
    job = launched.json()["job"]
    # the log's lines (stdout) and specops' notices (stderr) in one pipe, in the order they were written
    follower = cli.popen("logs", "--host", HOST, "--job", job["id"], "--follow", "--lines", "1000000",
                         merge_streams=True)
    reader = OutputReader(follower.stdout)
    try:
        wait_until(lambda: reader.first("line 20\n") is not None, what="the follower to print line 20")
        network.partition()
        cut = time.monotonic()
        cut_at = len(reader.lines)
        notice = wait_until(lambda: reader.first("reconnecting", cut_at), timeout_s=CHANNEL_TIMEOUT + SLACK_S,
                            what="the follower to notice the dead connection")
        noticed_after = time.monotonic() - cut
        network.heal()
        lines_at_heal = reader.count("line ")
        wait_until(lambda: reader.count("line ") > lines_at_heal + 20, timeout_s=30,
                   what="following to resume after the partition healed")
    finally:
        gate.touch()
        network.heal()
    try:
        follower.wait(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    reader.join()

    assert follower.returncode == 0, reader.text()
    assert f"{where(network)}: {DEAD_MESSAGE}" in reader.lines[notice]
    assert noticed_after < CHANNEL_TIMEOUT + SLACK_S
    shown = "".join(line for line in reader.lines
                    if not line.startswith(("specops: ", f"job {job['id']}: ")))
    log = Path(job["log"]).read_text()
    numbers = [int(line.split()[1]) for line in log.splitlines() if line.startswith("line ")]
    assert numbers == list(range(1, len(numbers) + 1)) and log.endswith("finished\n")
    assert shown == log
    assert f"job {job['id']}: succeeded (exit code 0)" in reader.text()
