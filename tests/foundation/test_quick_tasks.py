"""Quick tasks (`status`, `doctor`, `patch status|verify`) ride a shared OpenSSH master: a second one
makes no new SSH login, a master left by `invoke sync` serves them too, and every failure is still
refused and worded as over our own connection (unknown or changed host key, a closed port)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ssh_host
from tests.support.agent import wait_until
from tests.support.cli import Cli, write_inventory
from tests.support.sshd import SshServer, free_port

pytestmark = pytest.mark.ssh


def sockets(folder: Path) -> list[Path]:
    return [path for path in folder.iterdir() if path.is_socket()]


def test_a_second_status_makes_no_new_login(cli: Cli, sshd: SshServer, control_dir: Path,
                                             tmp_path: Path) -> None:
    before = sshd.logins()
    first = cli("status", "--host", "loop", "--json", SPECOPS_SSH_CONTROL_DIR=str(control_dir))
    assert first.exit_code == 0, first.stderr
    assert first.json()["jobs"] == [] and first.json()["host"] == "loop"
    assert (tmp_path / "loop-workdir" / "state" / "agent.sha256").exists()  # the bundle went over stdin
    assert sshd.logins() == before + 1
    assert len(sockets(control_dir)) == 1  # the master's, left for the next task
    second = cli("status", "--host", "loop", "--json", SPECOPS_SSH_CONTROL_DIR=str(control_dir))
    assert second.exit_code == 0, second.stderr
    assert second.json()["round_trips"] == 1
    assert sshd.logins() == before + 1


def test_a_master_left_by_sync_serves_status_and_patch_status(cli: Cli, sshd: SshServer,
                                                                       control_dir: Path) -> None:
    env = {"SPECOPS_SSH_CONTROL_DIR": str(control_dir)}
    before = sshd.logins()
    assert cli("sync", "--host", "loop", **env).exit_code == 0
    status = cli("status", "--host", "loop", "--json", **env)
    assert status.exit_code == 0, status.stderr
    patches = cli("patch", "status", "--host", "loop", "--json", **env)
    assert patches.exit_code == 0, patches.stderr
    assert "sets" in patches.json()
    assert sshd.logins() == before + 1


def test_without_sharing_each_status_logs_in_through_our_own_connection(cli: Cli, sshd: SshServer,
                                                                       control_dir: Path) -> None:
    before = sshd.logins()
    for _ in range(2):
        result = cli("status", "--host", "loop", "--json", SPECOPS_SSH_CONTROL_DIR=str(control_dir),
                     SPECOPS_SSH_PERSIST="0")
        assert result.exit_code == 0, result.stderr
    assert sshd.logins() == before + 2
    assert list(control_dir.iterdir()) == []


def _cli_for(tmp_path: Path, host: dict) -> Cli:
    inventory = write_inventory(tmp_path / "inventory.yaml", {"target": host}, default="target")
    return Cli(inventory, tmp_path / "logs")


def test_an_unknown_host_key_is_refused_with_its_fingerprint_and_nothing_runs(tmp_path: Path, sshd: SshServer,
                                                                            control_dir: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    cli = _cli_for(tmp_path, ssh_host(sshd, tmp_path / "wd", known_hosts))
    before = sshd.logins()
    result = cli("status", "--json", SPECOPS_SSH_CONTROL_DIR=str(control_dir))
    assert result.exit_code == 1
    error = json.loads(result.stdout)["error"]
    assert "host key not in" in error and "SHA256:" in error and "--accept-new-host-key" in error
    assert not known_hosts.exists()
    assert not (tmp_path / "wd").exists()
    assert sshd.logins() == before


def test_a_changed_host_key_is_refused_even_while_a_master_is_up(tmp_path: Path, sshd: SshServer,
                                                                 known_hosts: Path, control_dir: Path) -> None:
    cli = _cli_for(tmp_path, ssh_host(sshd, tmp_path / "wd", known_hosts))
    assert cli("status", SPECOPS_SSH_CONTROL_DIR=str(control_dir)).exit_code == 0
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    address = known_hosts.read_text().split()[0]
    key_type, key = other.with_suffix(".pub").read_text().split()[:2]
    known_hosts.write_text(f"{address} {key_type} {key}\n")
    refused = cli("status", SPECOPS_SSH_CONTROL_DIR=str(control_dir))
    assert refused.exit_code == 1
    assert "host key CHANGED" in refused.stderr
    assert known_hosts.read_text() == f"{address} {key_type} {key}\n"


def test_a_closed_port_fails_fast_with_one_line(tmp_path: Path, sshd: SshServer, control_dir: Path) -> None:
    cli = _cli_for(tmp_path, ssh_host(sshd, tmp_path / "wd", tmp_path / "known_hosts", port=free_port()))
    started = time.monotonic()
    result = cli("status", SPECOPS_SSH_CONTROL_DIR=str(control_dir))
    assert result.exit_code == 1
    assert "connection refused" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert time.monotonic() - started < 10


def test_a_stale_master_socket_does_not_fail_the_task(cli: Cli, sshd: SshServer, control_dir: Path) -> None:
    env = {"SPECOPS_SSH_CONTROL_DIR": str(control_dir)}
    assert cli("status", "--host", "loop", **env).exit_code == 0
    (socket_path,) = sockets(control_dir)
    subprocess.run(["ssh", "-o", f"ControlPath={socket_path}", "-O", "exit", "unused"], capture_output=True,
                   timeout=10)
    # the master unlinks its socket on its way out, after `-O exit` has answered
    wait_until(lambda: not socket_path.exists(), timeout_s=30, what="the master to remove its socket")
    # A socket file nobody listens on, where the master was (as after a crash of the master)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(socket_path))
    stale.close()
    again = cli("status", "--host", "loop", "--json", **env)
    assert again.exit_code == 0, again.stderr
    assert again.json()["jobs"] == []


def test_the_quick_path_loads_no_paramiko() -> None:
    # paramiko + fabric + cryptography is ~180 ms of every task's start: the quick tasks skip it
    from tests.support.repo import REPO

    probe = ("import sys; import remote.session, remote.agent, remote.ssh.master, remote.tasks.jobs, "
             "remote.tasks.doctor, remote.tasks.patch; "
             "print(sorted(m for m in ('paramiko', 'fabric', 'cryptography') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_log_tail_rides_the_master_and_a_follow_does_not(cli: Cli, sshd: SshServer, control_dir: Path) -> None:
    env = {"SPECOPS_SSH_CONTROL_DIR": str(control_dir)}
    assert cli("status", "--host", "loop", **env).exit_code == 0  # opens the master
    launched = cli("run", "--host", "loop", "--name", "hello", "--", "echo", "hello from the host", **env)
    assert launched.exit_code == 0, launched.stderr
    before = sshd.logins()
    tail = cli("logs", "--host", "loop", "--job", "hello", **env)
    assert tail.exit_code == 0, tail.stderr
    assert "hello from the host" in tail.stdout
    assert sshd.logins() == before
    followed = cli("logs", "--host", "loop", "--job", "hello", "--follow", **env)
    assert followed.exit_code == 0, followed.stderr
    assert "hello from the host" in followed.stdout
    assert sshd.logins() == before + 1  # a follow may reconnect and resume: our own connection
