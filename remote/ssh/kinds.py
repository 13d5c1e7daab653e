"""Connection kinds: how the workstation reaches a host, one object per kind, chosen once per host.

The inventory's `connection` names the kind (`local`: this machine, commands through `bash -c`; `ssh`:
fabric over a verified SSH transport, or OpenSSH's shared master for quick tasks). `kind_of(host)` is the
one place that name becomes an object; every caller asks the object, never the name:

- `open(...)`: the connection that runs commands and copies files back (`run`, `stream`, `download`);
- `rsync_destination(...)`: where `invoke sync` puts the workdir, and the remote shell rsync goes through;
- `sftp`: whether SFTP can stand in for rsync (a host without rsync, `invoke sync --sftp`);
- `peer_address(host)`: the address the host's peers reach it at (a rendezvous without a training network);
- `shown(host)`: where the hosts table says it is.

Light to import: fabric and paramiko load only when an SSH host is opened.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from remote.ssh.local import LocalConnection

if TYPE_CHECKING:
    from remote.inventory import Host, Inventory
    from remote.ssh.command import Connection


class ConnectionKind(Protocol):
    name: str
    sftp: bool  # SFTP can stand in for rsync

    def open(self, host: Host, inventory: Inventory | None, *, accept_new_host_key: bool,
             quick: bool) -> Connection:
        """A connection to `host` (a context manager). `quick`: for a task of a few commands safe to repeat."""
        ...

    def rsync_destination(self, host: Host, inventory: Inventory | None) -> tuple[list[str], str]:
        """rsync's options for reaching the host (its remote shell) and the workdir as rsync's destination."""
        ...

    def peer_address(self, host: Host) -> str:
        """The address another host reaches this one at (the inventory's, not a training network's)."""
        ...

    def shown(self, host: Host) -> str:
        """Where the host is, as the hosts table shows it."""
        ...


class LocalKind:
    """This machine: commands through `bash -c`, files copied in place."""

    name = "local"
    sftp = False

    def open(self, host: Host, inventory: Inventory | None, *, accept_new_host_key: bool,
             quick: bool) -> Connection:
        return LocalConnection(host)

    def rsync_destination(self, host: Host, inventory: Inventory | None) -> tuple[list[str], str]:
        Path(host.workdir).mkdir(parents=True, exist_ok=True)
        return [], host.workdir.rstrip("/") + "/"

    def peer_address(self, host: Host) -> str:
        return "127.0.0.1"

    def shown(self, host: Host) -> str:
        return "-"


class SSHKind:
    """A host over SSH: fabric (paramiko) with host keys verified, or OpenSSH through a shared master."""

    name = "ssh"
    sftp = True

    def open(self, host: Host, inventory: Inventory | None, *, accept_new_host_key: bool,
             quick: bool) -> Connection:
        if quick:
            from remote.ssh.master import shared_connection

            shared = shared_connection(host, inventory, accept_new_host_key=accept_new_host_key)
            if shared is not None:
                return shared
        from remote.ssh.connection import SSHConnection

        return SSHConnection(host, accept_new_host_key=accept_new_host_key, inventory=inventory)

    def rsync_destination(self, host: Host, inventory: Inventory | None) -> tuple[list[str], str]:
        from remote.ssh.openssh import ssh_command
        from remote.ssh.target import resolve_target

        # rsync's remote shell expands ~ for us only when unquoted: give it a home-relative path.
        workdir = host.workdir[2:] if host.workdir.startswith("~/") else host.workdir
        target = resolve_target(host)
        user = f"{target.user}@" if target.user else ""
        options = ["-e", ssh_command(host, inventory), "--rsync-path", f"mkdir -p {shlex.quote(workdir)} && rsync"]
        return options, f"{user}{target.hostname}:{workdir.rstrip('/')}/"

    def peer_address(self, host: Host) -> str:
        assert host.address  # the inventory requires one for connection: ssh
        return host.address

    def shown(self, host: Host) -> str:
        user = f"{host.user}@" if host.user else ""
        port = f":{host.port}" if host.port else ""
        return f"{user}{host.address}{port}"


KINDS: dict[str, ConnectionKind] = {kind.name: kind for kind in (LocalKind(), SSHKind())}


def kind_of(host: Host) -> ConnectionKind:
    """The host's connection kind (the inventory checked its `connection` against KINDS' names)."""
    return KINDS[host.connection]
