"""The SSH layer on fabric: fabric's accept-any-key default is never in effect, both hops of a jump
are verified, and fan-out runs one callable per host in parallel with per-host results."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from remote.errors import ConnectError, HostKeyError
from remote.inventory import load_inventory
from remote.ssh import fan_out, open_connection, threading_group
from tests.conftest import ssh_host
from tests.support.cli import write_inventory
from tests.support.sshd import SshServer, free_port

pytestmark = pytest.mark.ssh


def test_fabric_accepts_any_key_by_default_but_ours_refuses_an_unknown_key_and_runs_nothing(
        tmp_path: Path, sshd: SshServer) -> None:
    import fabric

    # What we guard against: a bare fabric Connection trusts whatever key the host offers.
    bare = fabric.Connection("127.0.0.1", port=sshd.port, user=sshd.user,
                             connect_kwargs={"key_filename": [str(sshd.client_key)], "look_for_keys": False})
    try:
        assert bare.run("true", hide=True, in_stream=False).ok
        assert bare.client.get_host_keys().lookup(f"[127.0.0.1]:{sshd.port}") is not None  # added silently
    finally:
        bare.close()

    known_hosts = tmp_path / "known_hosts"  # empty: the key is unknown
    inventory = write_inventory(tmp_path / "inventory.yaml",
                                {"target": ssh_host(sshd, tmp_path / "wd", known_hosts)}, default="target")
    host = load_inventory(inventory).host("target")
    logins_before = sshd.logins()
    with pytest.raises(HostKeyError, match="host key not in"):
        open_connection(host)
    assert sshd.logins() == logins_before  # refused before authenticating: nothing ran
    assert not known_hosts.exists() and not (tmp_path / "wd").exists()


def test_an_unknown_key_on_the_jump_host_is_refused_too(tmp_path: Path, sshd: SshServer, known_hosts: Path) -> None:
    hosts = {
        "bastion": ssh_host(sshd, tmp_path / "bastion-wd", tmp_path / "empty_known_hosts"),
        "inside": ssh_host(sshd, tmp_path / "inside-wd", known_hosts, jump="bastion"),
    }
    inventory = load_inventory(write_inventory(tmp_path / "inventory.yaml", hosts, default="inside"))
    logins_before = sshd.logins()
    with pytest.raises(HostKeyError, match="bastion"):
        open_connection(inventory.host("inside"), inventory=inventory)
    assert sshd.logins() == logins_before
    assert not (tmp_path / "empty_known_hosts").exists()


def test_fan_out_runs_one_callable_per_host_in_parallel_and_keeps_each_hosts_result(
        tmp_path: Path, sshd: SshServer, known_hosts: Path) -> None:
    hosts = {
        "one": ssh_host(sshd, tmp_path / "one-wd", known_hosts),
        "two": ssh_host(sshd, tmp_path / "two-wd", known_hosts),
        "down": ssh_host(sshd, tmp_path / "down-wd", known_hosts, port=free_port()),
    }
    inventory = load_inventory(write_inventory(tmp_path / "inventory.yaml", hosts, default="one"))
    together = threading.Barrier(2, timeout=30)  # only passes if both hosts' work runs at the same time

    def work(host, conn) -> str:
        together.wait()
        return conn.run(["echo", host.name]).stdout.decode().strip()

    outcomes = fan_out([inventory.host("one"), inventory.host("two"), inventory.host("down")], work,
                       inventory=inventory)
    assert {name: outcome.value for name, outcome in outcomes.items() if outcome.ok} == {"one": "one", "two": "two"}
    assert isinstance(outcomes["down"].error, ConnectError) and "connection refused" in str(outcomes["down"].error)


def test_opened_hosts_form_a_fabric_threading_group(tmp_path: Path, sshd: SshServer, known_hosts: Path) -> None:
    # Two addresses of the one sshd: fabric tells a group's members apart by host, user and port.
    known_hosts.write_text(sshd.known_hosts_line() + sshd.known_hosts_line().replace("127.0.0.1", "localhost"))
    hosts = {"one": ssh_host(sshd, tmp_path / "one-wd", known_hosts),
             "two": ssh_host(sshd, tmp_path / "two-wd", known_hosts, address="localhost")}
    inventory = load_inventory(write_inventory(tmp_path / "inventory.yaml", hosts, default="one"))
    connections = [open_connection(inventory.host(name), inventory=inventory) for name in hosts]
    try:
        results = threading_group(connections).run("echo $((6 * 7))", hide=True, in_stream=False)
        assert len(results) == 2 and all(result.stdout.strip() == "42" for result in results.values())
    finally:
        for conn in connections:
            conn.close()


def test_a_jump_host_that_is_down_is_named_in_the_error(tmp_path: Path, sshd: SshServer, known_hosts: Path) -> None:
    hosts = {
        "bastion": ssh_host(sshd, tmp_path / "bastion-wd", known_hosts, port=free_port()),
        "inside": ssh_host(sshd, tmp_path / "inside-wd", known_hosts, jump="bastion"),
    }
    inventory = load_inventory(write_inventory(tmp_path / "inventory.yaml", hosts, default="inside"))
    with pytest.raises(ConnectError, match=r"^bastion \(127\.0\.0\.1:\d+\): connection refused"):
        open_connection(inventory.host("inside"), inventory=inventory)
