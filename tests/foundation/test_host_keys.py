"""Host keys are verified: unknown and changed keys are refused; accepting one is explicit."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ssh_host
from tests.support.cli import Cli, write_inventory
from tests.support.sshd import SshServer, free_port

pytestmark = pytest.mark.ssh


def _cli_for(tmp_path: Path, host: dict) -> Cli:
    inventory = write_inventory(tmp_path / "inventory.yaml", {"target": host}, default="target")
    return Cli(inventory, tmp_path / "logs")


def test_an_unknown_host_key_is_refused_and_nothing_is_recorded(tmp_path: Path, sshd: SshServer) -> None:
    known_hosts = tmp_path / "known_hosts"
    cli = _cli_for(tmp_path, ssh_host(sshd, tmp_path / "wd", known_hosts))
    result = cli("check", "--json")
    assert result.exit_code == 1
    assert "host key not in" in result.stderr and "--accept-new-host-key" in result.stderr
    assert "SHA256:" in result.stderr
    assert not known_hosts.exists()
    assert not (tmp_path / "wd").exists()  # nothing ran on the host


def test_accept_new_host_key_records_the_key_and_later_connects_verify_it(tmp_path: Path, sshd: SshServer) -> None:
    known_hosts = tmp_path / "ssh" / "known_hosts"
    cli = _cli_for(tmp_path, ssh_host(sshd, tmp_path / "wd", known_hosts))
    accepted = cli("check", "--json", "--accept-new-host-key")
    assert accepted.exit_code == 0, accepted.stderr
    recorded = known_hosts.read_text()
    assert recorded.split()[:3] == sshd.known_hosts_line().split()[:3]
    journal = [json.loads(line) for line in (tmp_path / "logs" / "journal.jsonl").read_text().splitlines()]
    assert journal[-1]["event"] == "accept-host-key" and journal[-1]["host"] == "target"
    again = cli("check", "--json")
    assert again.exit_code == 0, again.stderr
    assert known_hosts.read_text() == recorded  # nothing added the second time


def test_a_changed_host_key_is_refused_even_with_accept_new(tmp_path: Path, sshd: SshServer) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    key_type, key_b64 = other.with_suffix(".pub").read_text().split()[:2]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {key_type} {key_b64}\n")
    cli = _cli_for(tmp_path, ssh_host(sshd, tmp_path / "wd", known_hosts))
    for flags in ([], ["--accept-new-host-key"]):
        result = cli("check", "--json", *flags)
        assert result.exit_code == 1
        assert "host key CHANGED" in result.stderr
    assert known_hosts.read_text() == f"[127.0.0.1]:{sshd.port} {key_type} {key_b64}\n"


def test_a_closed_port_fails_fast_with_a_clear_message(tmp_path: Path, sshd: SshServer) -> None:
    host = ssh_host(sshd, tmp_path / "wd", tmp_path / "known_hosts", port=free_port())
    cli = _cli_for(tmp_path, host)
    started = time.monotonic()
    result = cli("check")
    assert result.exit_code == 1
    assert "connection refused" in result.stderr
    assert time.monotonic() - started < 5


def test_a_host_that_accepts_but_never_answers_times_out_in_seconds(tmp_path: Path, sshd: SshServer) -> None:
    # A listener that never sends the SSH banner behaves like a partitioned or hung host.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(silent.accept()[0]), daemon=True).start()
    host = ssh_host(sshd, tmp_path / "wd", tmp_path / "known_hosts", port=silent.getsockname()[1],
                    connect_timeout=1.5)
    cli = _cli_for(tmp_path, host)
    started = time.monotonic()
    result = cli("check")
    elapsed = time.monotonic() - started
    silent.close()
    assert result.exit_code == 1
    assert "no answer within 1.5 s" in result.stderr or "banner" in result.stderr.lower()
    assert elapsed < 8


def test_with_json_a_connection_failure_is_still_one_json_document(tmp_path: Path, sshd: SshServer) -> None:
    cli = _cli_for(tmp_path, ssh_host(sshd, tmp_path / "wd", tmp_path / "known_hosts", port=free_port()))
    result = cli("check", "--json")
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert document["ok"] is False and "connection refused" in document["error"]
