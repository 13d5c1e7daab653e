"""The training network of a host (inventory `train_address`, `train_interface`) reaches its engine's node:
the first host's training address is the rendezvous endpoint, every node binds its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from remote.inventory import Host, load_inventory
from remote.pipeline_nodes import engine_args, rendezvous_endpoint
from tests.conftest import ssh_host
from tests.support.cli import Cli, write_inventory
from tests.support.sshd import SshServer


def host(**settings: object) -> Host:
    return Host(**{"name": "gpu1", "address": "gpu1.example", "workdir": "/w", "python": "/p", **settings})


def test_the_rendezvous_is_at_the_first_hosts_training_address_when_it_has_one() -> None:
    assert str(rendezvous_endpoint(host(), 29400)) == "gpu1.example:29400"
    assert str(rendezvous_endpoint(host(train_address="10.1.0.11"), 29400)) == "10.1.0.11:29400"
    assert str(rendezvous_endpoint(host(train_address="fd00::11"), 29400)) == "[fd00::11]:29400"


def test_each_node_binds_its_training_address_and_names_its_interface() -> None:
    first, second = host(train_address="10.1.0.11"), host(name="gpu2", train_address="10.1.0.12", train_interface="ib0")
    args = engine_args("r", [first, second], 1, "r-1", 29400, samples=None, backend=None, skip_patches=False)
    assert args[args.index("--local-addr") + 1] == "10.1.0.12" and args[args.index("--interface") + 1] == "ib0"
    assert args[args.index("--rendezvous") + 1] == "10.1.0.11:29400"
    plain = engine_args("r", [host(), host(name="gpu2")], 1, "r-1", 29400, samples=None, backend=None,
                        skip_patches=False)
    assert "--local-addr" not in plain and "--interface" not in plain  # torch's own choice, as before


def test_the_inventory_reads_the_training_network(tmp_path: Path) -> None:
    path = write_inventory(tmp_path / "inventory.yaml", {"gpu1": {
        "address": "gpu1.example", "workdir": "/w", "python": "/p", "train_address": "10.1.0.11",
        "train_interface": "ib0"}}, default="gpu1")
    gpu1 = load_inventory(path).host("gpu1")
    assert (gpu1.train_address, gpu1.train_interface) == ("10.1.0.11", "ib0")


@pytest.mark.ssh
@pytest.mark.parametrize(("settings", "expected"), [
    ({"train_address": "203.0.113.254"}, "hosts.gpu2.train_address: 203.0.113.254 is not an address of this host"),
    ({"train_address": "127.0.0.1", "train_interface": "nosuch0"},
     "hosts.gpu2.train_interface: nosuch0 is not an interface of this host (it has "),
])
def test_a_training_network_a_host_lacks_is_bad_input_before_any_node_starts(
        tmp_path: Path, sshd: SshServer, known_hosts: Path, settings: dict, expected: str) -> None:
    hosts = {"gpu1": {**ssh_host(sshd, tmp_path / "gpu1-workdir", known_hosts), "train_address": "127.0.0.1"},
             "gpu2": {**ssh_host(sshd, tmp_path / "gpu2-workdir", known_hosts), **settings}}
    inventory = write_inventory(tmp_path / "inventory.yaml", hosts, default="gpu1")
    result = Cli(inventory, tmp_path / "logs")("train", "--hosts", "gpu1,gpu2", "--run", "tiny", "--skip-doctor")
    assert result.exit_code == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"specops: {inventory}: {expected}")
    assert [list((tmp_path / f"{name}-workdir" / "state" / "jobs").glob("*.json")) for name in hosts] == [[], []]
