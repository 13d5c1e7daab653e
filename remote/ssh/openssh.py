"""OpenSSH client command lines: for the tools that bring their own ssh (rsync's `-e`) and for the
shared-master connection of quick tasks (remote.ssh.master).

The same settings as our fabric connections: the inventory's key, port, known_hosts with strict
checking, timeouts, and the jump host as a ProxyCommand carrying the jump host's own settings.

Connection sharing the field's way: OpenSSH's ControlMaster/ControlPersist. The first command opens
a master (host key verified then, against the inventory's known_hosts) that stays up for
`SPECOPS_SSH_PERSIST` seconds (default 120; 0 turns sharing off) after its last session, so the
next `invoke sync` or quick task skips the TCP connect, key exchange and authentication. The socket lives in a
private folder (`SPECOPS_SSH_CONTROL_DIR`, default ~/.cache/specops/ssh, mode 0700) under a name
hashed from every option, the destination and the known_hosts file's size and mtime: a host with
other settings, another key, another jump host or an edited known_hosts never reuses a master.
paramiko (our own connections) cannot speak OpenSSH's mux protocol, so only OpenSSH clients share.
"""

from __future__ import annotations

import hashlib
import math
import os
import shlex
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from remote.ssh.target import jump_host, resolve_target

if TYPE_CHECKING:
    from remote.inventory import Host, Inventory

DEFAULT_PERSIST_S = 120
ALIVE_COUNT = 2
SOCKET_PATH_MAX = 100  # sun_path is 104-108 bytes; OpenSSH appends a random suffix while binding


def ssh_options(host: Host) -> list[str]:
    """OpenSSH client options equal to our own connection's: key, port, strict known_hosts, timeouts."""
    target = resolve_target(host)
    known_hosts = os.path.expanduser(host.known_hosts)
    # Dead after about channel_timeout of silence, as our own connections judge it: a keepalive
    # after each third of it, given up when the next two go unanswered.
    alive_interval = max(1, math.ceil(host.channel_timeout / (ALIVE_COUNT + 1)))
    parts = ["-p", str(target.port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
             "-o", f"UserKnownHostsFile={known_hosts}", "-o", f"ConnectTimeout={max(1, int(host.connect_timeout))}",
             "-o", f"ServerAliveInterval={alive_interval}", "-o", f"ServerAliveCountMax={ALIVE_COUNT}",
             "-o", "IPQoS=throughput"]
    for identity in target.identity_files:
        parts += ["-i", identity, "-o", "IdentitiesOnly=yes"]
    return parts


def destination(host: Host) -> str:
    target = resolve_target(host)
    return f"{target.user}@{target.hostname}" if target.user else target.hostname


def ssh_command(host: Host, inventory: Inventory | None) -> str:
    """The `ssh ...` line (without the destination) for rsync's -e: verified, shared when allowed."""
    return shlex.join(ssh_argv(host, inventory))


def ssh_argv(host: Host, inventory: Inventory | None) -> list[str]:
    """`ssh` and its options (without the destination): verified, through a shared master when allowed."""
    parts = client_argv(host, inventory)
    return parts + sharing_options(host, parts[1:])


def client_argv(host: Host, inventory: Inventory | None) -> list[str]:
    """`ssh` and the host's own options (jump host included), without connection sharing."""
    parts = ["ssh", *ssh_options(host)]
    jump = jump_host(host, inventory)
    if jump is not None:
        # Not -J: OpenSSH would reach the jump host without our key and known_hosts. A ProxyCommand
        # carries the jump host's own settings, host-key verification included.
        proxy = shlex.join(["ssh", *ssh_options(jump), "-W", "%h:%p", destination(jump)])
        parts += ["-o", f"ProxyCommand={proxy}"]
    return parts


def persist_seconds() -> int:
    text = os.environ.get("SPECOPS_SSH_PERSIST", "")
    try:
        return max(0, int(text)) if text else DEFAULT_PERSIST_S
    except ValueError:
        return DEFAULT_PERSIST_S


def control_dir() -> Path | None:
    """The private folder of the master sockets, made if missing; None when it is not ours alone."""
    folder = Path(os.environ.get("SPECOPS_SSH_CONTROL_DIR") or "~/.cache/specops/ssh").expanduser()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.stat()
    except OSError:
        return None
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        return None  # someone else could reach (or plant) a socket there: no sharing
    return folder


def sharing_options(host: Host, options: list[str]) -> list[str]:
    """ControlMaster/ControlPath/ControlPersist for this exact set of options, or none."""
    socket_path = control_socket(host, options)
    return [] if socket_path is None else master_options(socket_path)


def master_options(socket_path: Path) -> list[str]:
    return ["-o", "ControlMaster=auto", "-o", f"ControlPath={socket_path}", "-o", f"ControlPersist={persist_seconds()}"]


def control_socket(host: Host, options: list[str]) -> Path | None:
    """The shared master's socket for this exact set of options; None when sharing is off or unsafe."""
    folder = control_dir() if persist_seconds() else None
    if folder is None:
        return None
    known_hosts = Path(host.known_hosts).expanduser()
    try:
        known = known_hosts.stat()
        known_key = f"{known.st_size}:{known.st_mtime_ns}"
    except OSError:
        known_key = "missing"
    key = "\0".join([*options, destination(host), known_key])
    socket_path = folder / hashlib.sha256(key.encode()).hexdigest()[:24]
    if len(str(socket_path)) > SOCKET_PATH_MAX:
        return None
    # ControlPath is read with ssh's %-expansion: a literal % in the folder would be mangled.
    if "%" in str(socket_path):
        return None
    return socket_path
