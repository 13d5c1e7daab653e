"""The face of the SSH layer: open a connection to any inventory host, whatever its kind (remote.ssh.kinds:
local, or SSH through fabric).

    with open_connection(host, inventory=inventory) as conn:
        conn.run(["true"])

Light to import: fabric and paramiko load only when an SSH host is opened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from remote.ssh.command import CommandResult, Connection, shell_command
from remote.ssh.fanout import HostOutcome, fan_out, threading_group
from remote.ssh.kinds import KINDS, ConnectionKind, kind_of
from remote.ssh.local import LocalConnection
from remote.ssh.target import Target, jump_host, resolve_target

if TYPE_CHECKING:
    from remote.inventory import Host, Inventory

__all__ = ["KINDS", "CommandResult", "Connection", "ConnectionKind", "HostOutcome", "LocalConnection", "Target",
           "fan_out", "jump_host", "kind_of", "open_connection", "resolve_target", "shell_command", "threading_group"]


def open_connection(host: Host, *, accept_new_host_key: bool = False,
                    inventory: Inventory | None = None, quick: bool = False) -> Connection:
    """A connection to `host`; use it as a context manager. Host keys verified (see host_keys).

    `quick`: for a task of a few commands that are safe to repeat — through OpenSSH and a shared
    master when sharing is on (remote.ssh.master), so a second quick task makes no new login."""
    return kind_of(host).open(host, inventory, accept_new_host_key=accept_new_host_key, quick=quick)
