"""Connection kinds (remote.ssh.kinds): the inventory's `connection` names one, and that object, not the
name, says how the host is reached — its connection, rsync's destination, its address to its peers."""

from __future__ import annotations

from pathlib import Path

import pytest

from remote.inventory import CONNECTIONS, Host, load_inventory
from remote.pipeline_nodes import rendezvous_endpoint
from remote.ssh import KINDS, LocalConnection, kind_of, open_connection


def host(**settings: object) -> Host:
    return Host(**{"name": "h", "address": "gpu1.example", "workdir": "/w", "python": "/p", **settings})


def test_every_connection_the_inventory_accepts_is_a_kind() -> None:
    assert set(KINDS) == set(CONNECTIONS)
    assert all(kind_of(host(connection=name)).name == name for name in CONNECTIONS)


def test_a_local_host_is_this_machine(tmp_path: Path) -> None:
    local = host(connection="local", address=None, workdir=str(tmp_path / "w"))
    kind = kind_of(local)
    with kind.open(local, None, accept_new_host_key=False, quick=True) as conn:
        assert isinstance(conn, LocalConnection) and conn.run(["echo", "hi"]).stdout == b"hi\n"
    assert kind.rsync_destination(local, None) == ([], f"{tmp_path / 'w'}/") and (tmp_path / "w").is_dir()
    assert str(rendezvous_endpoint(local, 29400)) == "127.0.0.1:29400" and kind.shown(local) == "-"
    assert not kind.sftp


def test_an_ssh_host_is_reached_through_its_own_ssh_settings() -> None:
    remote_host = host(user="me", port=2222, workdir="~/specops")
    kind = kind_of(remote_host)
    options, destination = kind.rsync_destination(remote_host, None)
    assert destination == "me@gpu1.example:specops/"
    assert options[0] == "-e" and options[1].startswith("ssh ") and "StrictHostKeyChecking=yes" in options[1]
    assert options[2:] == ["--rsync-path", "mkdir -p specops && rsync"]
    assert kind.peer_address(remote_host) == "gpu1.example" and kind.shown(remote_host) == "me@gpu1.example:2222"
    assert kind.sftp


@pytest.mark.ssh
@pytest.mark.parametrize("quick", [False, True], ids=["fabric", "openssh-master"])
def test_every_kinds_connection_puts_and_gets_a_file(tmp_path: Path, inventory: Path, control_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch, quick: bool) -> None:
    """copy both ways through the connection a kind opens: `local` (a file here) and `ssh` (the loopback sshd,
    through fabric or the shared OpenSSH master), the folder made on the way."""
    monkeypatch.setenv("SPECOPS_SSH_CONTROL_DIR", str(control_dir))
    data = bytes(range(256)) * 3
    for name in ("local", "loop"):
        chosen = load_inventory(inventory).host(name)
        with open_connection(chosen, quick=quick) as conn:
            remote_path = f"{chosen.workdir}/tmp/deep/{name}.bin"
            conn.upload(data, remote_path)
            conn.download(remote_path, tmp_path / f"{name}.back")
        assert (tmp_path / f"{name}.back").read_bytes() == data
