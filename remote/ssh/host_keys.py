"""Host-key policy: known_hosts is the truth. Unknown keys are refused, or accepted and journaled
when asked (`--accept-new-host-key`, OpenSSH's accept-new); a changed key is always refused.

fabric's Connection installs paramiko's AutoAddPolicy (accept any key); `verify_host_keys`
replaces it on every client we open, before any connect.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import paramiko

from remote import journal
from remote.errors import HostKeyError
from remote.inventory import Host


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class RefuseUnknownKey(paramiko.RejectPolicy):
    """RejectPolicy, with a message that says what to check and how to accept."""

    def __init__(self, host: Host, known_hosts: Path) -> None:
        self.host, self.known_hosts = host, known_hosts

    def missing_host_key(self, client, hostname, key) -> None:
        raise HostKeyError(
            f"{self.host.name} ({hostname}): host key not in {self.known_hosts} — refused. "
            f"Check the fingerprint {key.get_name()} {fingerprint(key)} with the host's owner, then run "
            f"again with --accept-new-host-key to record it")


class AcceptNewKey(paramiko.MissingHostKeyPolicy):
    """OpenSSH's accept-new: record an unknown key; a changed key is still refused by paramiko."""

    def __init__(self, host: Host, known_hosts: Path) -> None:
        self.host, self.known_hosts = host, known_hosts

    def missing_host_key(self, client, hostname, key) -> None:
        self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        fd = os.open(self.known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        client.get_host_keys().add(hostname, key.get_name(), key)
        journal.record("accept-host-key", host=self.host.name, address=hostname, key_type=key.get_name(),
                       fingerprint=fingerprint(key), known_hosts=str(self.known_hosts))


def verify_host_keys(client: paramiko.SSHClient, host: Host, *, accept_new: bool) -> Path:
    """Load only the inventory's known_hosts into `client` and set our policy; the file's path."""
    known_hosts = Path(host.known_hosts).expanduser()
    if known_hosts.exists():
        client.load_host_keys(str(known_hosts))
    policy = AcceptNewKey if accept_new else RefuseUnknownKey
    client.set_missing_host_key_policy(policy(host, known_hosts))
    return known_hosts


def changed_key_error(where: str, known_hosts: Path, exc: paramiko.BadHostKeyException) -> HostKeyError:
    return HostKeyError(
        f"{where}: host key CHANGED — refused. known_hosts {known_hosts} has "
        f"{exc.expected_key.get_name()} {fingerprint(exc.expected_key)}, the host offered "
        f"{exc.key.get_name()} {fingerprint(exc.key)}. If the host was really reinstalled, remove its "
        f"line from {known_hosts} and accept the new key explicitly")
