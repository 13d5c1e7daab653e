"""A host behind a jump host: our connection, rsync and the quick tasks' shared OpenSSH master all go
through it, keys verified on both hops."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ssh_host
from tests.support.cli import Cli, write_inventory
from tests.support.sshd import SshServer

pytestmark = pytest.mark.ssh


def _cli(tmp_path: Path, sshd: SshServer, known_hosts: Path, target_address: str) -> Cli:
    # The real sshd is both the bastion and, through a direct-tcpip channel, the target.
    hosts = {
        "bastion": ssh_host(sshd, tmp_path / "bastion-wd", known_hosts),
        "inside": ssh_host(sshd, tmp_path / "inside-wd", known_hosts, address=target_address, jump="bastion"),
    }
    return Cli(write_inventory(tmp_path / "inventory.yaml", hosts, default="inside"), tmp_path / "logs")


def test_check_sync_and_status_go_through_the_jump_host(tmp_path: Path, sshd: SshServer, known_hosts: Path,
                                                        control_dir: Path) -> None:
    cli = _cli(tmp_path, sshd, known_hosts, "127.0.0.1")
    check = cli("check", "--json")
    assert check.exit_code == 0, check.stderr
    assert check.json()["round_trips"] == 1
    synced = cli("sync", "--json")
    assert synced.exit_code == 0, synced.stderr
    assert (tmp_path / "inside-wd" / "src" / "specops" / "cli.py").exists()
    status = cli("status", "--json", SPECOPS_SSH_CONTROL_DIR=str(control_dir))
    assert status.exit_code == 0, status.stderr
    assert status.json()["host"] == "inside" and status.json()["jobs"] == []


def test_the_target_behind_the_jump_host_still_needs_a_known_key(tmp_path: Path, sshd: SshServer,
                                                                  known_hosts: Path, control_dir: Path) -> None:
    # Reached as "localhost", the target's key is not in known_hosts (only [127.0.0.1]:port is).
    cli = _cli(tmp_path, sshd, known_hosts, "localhost")
    result = cli("check")
    assert result.exit_code == 1
    assert "host key not in" in result.stderr and "inside" in result.stderr
    synced = cli("sync")
    assert synced.exit_code == 1 and "host key" in synced.stderr
    status = cli("status", SPECOPS_SSH_CONTROL_DIR=str(control_dir))
    assert status.exit_code == 1
    assert "host key not in" in status.stderr and "inside" in status.stderr
