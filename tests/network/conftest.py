"""A host behind a network the tests can cut: sshd in a network namespace, reached over a veth pair.

One namespace serves the module; every test starts with the network whole and leaves it healed.
The host's workdir is a local path (the namespace shares the filesystem), so tests read job logs
and clean up jobs directly.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from remote.agent import forget_current
from remote.inventory import load_inventory
from tests.support.agent import Agent
from tests.support.cli import Cli, write_inventory
from tests.support.netns import NetnsHost, NetnsUnavailable, create_netns_host

PYTHON = sys.executable
CONNECT_TIMEOUT = 2.0
CHANNEL_TIMEOUT = 3.0
HOST = "cut"


@pytest.fixture(scope="module")
def netns_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsHost]:
    try:
        host = create_netns_host(tmp_path_factory.mktemp("netns-sshd"))
    except NetnsUnavailable as exc:
        pytest.skip(f"network namespaces unavailable: {exc}")
    yield host
    host.destroy()


@pytest.fixture
def network(netns_host: NetnsHost) -> Iterator[NetnsHost]:
    """The namespace host, its network whole at the start and healed at the end of the test."""
    netns_host.heal()
    yield netns_host
    netns_host.heal()


def write_host_inventory(tmp_path: Path, network: NetnsHost, python: str = PYTHON) -> Path:
    """An inventory whose host `cut` is the sshd in the namespace, with short timeouts."""
    assert network.server is not None
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(network.server.known_hosts_line())
    hosts = {HOST: {"address": network.address, "port": network.port, "user": network.server.user,
                    "identity_file": str(network.server.client_key), "known_hosts": str(known_hosts),
                    "workdir": str(tmp_path / "cut-workdir"), "python": python,
                    "connect_timeout": CONNECT_TIMEOUT, "channel_timeout": CHANNEL_TIMEOUT}}
    return write_inventory(tmp_path / "inventory.yaml", hosts, default=HOST)


@pytest.fixture
def host_inventory(tmp_path: Path, network: NetnsHost) -> Iterator[Path]:
    path = write_host_inventory(tmp_path, network)
    workdir = tmp_path / "cut-workdir"
    yield path
    network.heal()
    Agent(workdir).clean_up()  # jobs and their tmux server, started inside the namespace
    forget_current(load_inventory(path).host(HOST))


@pytest.fixture
def cli(host_inventory: Path, tmp_path: Path) -> Cli:
    return Cli(host_inventory, tmp_path / "logs")
