"""Where an inventory host really is: ~/.ssh/config aliases resolved, and its jump host."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from remote.inventory import Host, Inventory


@dataclass(frozen=True)
class Target:
    hostname: str
    port: int
    user: str | None
    identity_files: tuple[str, ...]


def resolve_target(host: Host) -> Target:
    """The host's address, port, user and keys: the inventory's values first, then ~/.ssh/config's."""
    assert host.address
    looked_up: dict = {}
    path = Path("~/.ssh/config").expanduser()
    if path.exists():
        import paramiko  # only when there is a config to read: start-up stays lean

        looked_up = paramiko.SSHConfig.from_path(str(path)).lookup(host.address)
    hostname = looked_up.get("hostname", host.address)
    port = host.port or int(looked_up.get("port", 22))
    user = host.user or looked_up.get("user")
    identities = [host.identity_file] if host.identity_file else list(looked_up.get("identityfile", []))
    return Target(hostname, port, user, tuple(os.path.expanduser(path) for path in identities))


def jump_host(host: Host, inventory: Inventory | None) -> Host | None:
    """The host to go through: another inventory host, or `user@host[:port]` with this host's key settings."""
    from remote.inventory import Host

    if not host.jump:
        return None
    if inventory is not None and host.jump in inventory.hosts:
        return inventory.hosts[host.jump]
    user, _, rest = host.jump.rpartition("@")
    address, _, port = rest.partition(":")
    return Host(name=f"jump:{host.jump}", address=address, user=user or None, port=int(port) if port else None,
                identity_file=host.identity_file, known_hosts=host.known_hosts, workdir="/", python="python3",
                connect_timeout=host.connect_timeout, channel_timeout=host.channel_timeout)
