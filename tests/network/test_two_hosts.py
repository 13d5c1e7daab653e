"""Two hosts, each a network namespace with its own address and its own sshd: `--hosts` asks both at
once, one row each, and a partitioned one is its own failed row within its connect timeout while the
other still answers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.network.conftest import CHANNEL_TIMEOUT, CONNECT_TIMEOUT, PYTHON
from tests.support.agent import Agent
from tests.support.cli import Cli, write_inventory
from tests.support.netns import NetnsHost, NetnsUnavailable, netns_hosts

pytestmark = pytest.mark.ssh

SLACK_S = 30.0  # invoke's start-up on a loaded machine; a hang would be minutes


@pytest.fixture(scope="module")
def two_netns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NetnsHost]]:
    try:
        hosts = netns_hosts(lambda tag: tmp_path_factory.mktemp(f"netns-{tag}"), ("a", "b"))
    except NetnsUnavailable as exc:
        pytest.skip(f"network namespaces unavailable: {exc}")
    yield hosts
    for host in hosts:
        host.destroy()


@pytest.fixture
def cli(tmp_path: Path, two_netns: list[NetnsHost]) -> Iterator[Cli]:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("".join(host.server.known_hosts_line() for host in two_netns if host.server))
    hosts = {}
    for name, host in zip(("gpu1", "gpu2"), two_netns, strict=True):
        assert host.server is not None
        hosts[name] = {"address": host.address, "port": host.port, "user": host.server.user,
                       "identity_file": str(host.server.client_key), "known_hosts": str(known_hosts),
                       "workdir": str(tmp_path / f"{name}-workdir"), "python": PYTHON,
                       "connect_timeout": CONNECT_TIMEOUT, "channel_timeout": CHANNEL_TIMEOUT}
    yield Cli(write_inventory(tmp_path / "inventory.yaml", hosts, default="gpu1"), tmp_path / "logs")
    for host in two_netns:
        host.heal()
    for name in ("gpu1", "gpu2"):
        Agent(tmp_path / f"{name}-workdir").clean_up()


def test_two_hosts_with_their_own_addresses_answer_in_one_table(cli: Cli, two_netns: list[NetnsHost]) -> None:
    assert two_netns[0].address != two_netns[1].address
    result = cli("check", "--hosts", "gpu1,gpu2", "--json")
    assert result.exit_code == 0, result.stderr
    rows = {row["host"]: row for row in result.json()["hosts"]}
    assert rows["gpu1"]["ok"] and rows["gpu2"]["ok"]
    status = cli("status", "--hosts", "gpu1,gpu2", "--json")
    assert status.exit_code == 0 and [row["summary"] for row in status.json()["hosts"]] == ["no jobs", "no jobs"]


def test_a_partitioned_host_is_its_own_failed_row_and_the_other_still_answers(
        cli: Cli, two_netns: list[NetnsHost]) -> None:
    with two_netns[1].partitioned():
        started = time.monotonic()
        result = cli("check", "--hosts", "gpu1,gpu2", "--json", timeout=120)
        elapsed = time.monotonic() - started
    assert result.exit_code == 1
    rows = {row["host"]: row for row in result.json()["hosts"]}
    assert rows["gpu1"]["ok"] is True
    assert rows["gpu2"]["ok"] is False
    assert f"gpu2 ({two_netns[1].address}:{two_netns[1].port}): no answer within {CONNECT_TIMEOUT:g} s" \
        in rows["gpu2"]["summary"]
    assert elapsed < CONNECT_TIMEOUT + SLACK_S
