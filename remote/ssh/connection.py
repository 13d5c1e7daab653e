"""An SSH host as a `fabric.Connection`, with what specops adds on top.

fabric owns the connection's lifecycle, the jump host (`gateway`, itself a verified Connection),
SFTP and groups of hosts; `conn.fabric` is an Invoke Context for anything run the Invoke way.
On top, here: host keys verified against the inventory's known_hosts (never fabric's default
AutoAddPolicy), TCP_NODELAY (Nagle adds ~30 ms per round trip), connect/banner/auth/channel
timeouts so a dead or partitioned host is a clear error in seconds, and commands whose liveness
is judged by keepalive replies (remote.ssh.liveness).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import fabric
import paramiko

from remote.errors import ConnectError
from remote.inventory import Host, Inventory
from remote.ssh import liveness
from remote.ssh.command import CommandResult, shell_command, upload_through_shell
from remote.ssh.host_keys import changed_key_error, verify_host_keys
from remote.ssh.target import Target, jump_host, resolve_target

KEEPALIVE_S = 5


class _VerifiedFabricConnection(fabric.Connection):
    """fabric.Connection opening its own socket (TCP_NODELAY) and its gateway channel with a deadline."""

    def __init__(self, host: Host, target: Target, *, gateway: _VerifiedFabricConnection | None) -> None:
        identities = list(target.identity_files)
        super().__init__(
            target.hostname, user=target.user, port=target.port, gateway=gateway or False,
            # ~/.ssh/config was applied by resolve_target: fabric must not apply it a second time
            config=fabric.Config(ssh_config=paramiko.SSHConfig()),
            connect_kwargs={"key_filename": identities or None, "look_for_keys": not identities,
                            "allow_agent": not identities, "timeout": host.connect_timeout,
                            "banner_timeout": host.connect_timeout, "auth_timeout": host.connect_timeout,
                            "channel_timeout": host.connect_timeout})
        self.specops_host = host

    def open(self):
        if self.is_connected:
            return None
        if not self.gateway:
            sock = socket.create_connection((self.host, self.port), timeout=self.specops_host.connect_timeout)
            if os.environ.get("SPECOPS_TCP_NODELAY", "1") != "0":  # off only to measure Nagle's cost
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.connect_kwargs["sock"] = sock
        return super().open()

    @property
    def where(self) -> str:
        return f"{self.specops_host.name} ({self.host}:{self.port})"

    def open_gateway(self):
        open_explained(self.gateway)  # a jump host's failure names the jump host
        return self.gateway.transport.open_channel("direct-tcpip", (self.host, int(self.port)), ("127.0.0.1", 0),
                                                   timeout=self.specops_host.connect_timeout)


def _fabric_connection(host: Host, inventory: Inventory | None, accept_new: bool) -> _VerifiedFabricConnection:
    """An unopened fabric Connection to `host` (and its jump host), both hops' keys verified."""
    jump = jump_host(host, inventory)
    gateway = _fabric_connection(jump, inventory, accept_new) if jump is not None else None
    connection = _VerifiedFabricConnection(host, resolve_target(host), gateway=gateway)
    verify_host_keys(connection.client, host, accept_new=accept_new)
    return connection


def open_explained(connection: _VerifiedFabricConnection) -> None:
    """Open `connection`; any failure becomes one ConnectError line naming the host and what went wrong."""
    host, where = connection.specops_host, connection.where
    known_hosts = Path(host.known_hosts).expanduser()
    started = time.monotonic()
    try:
        connection.open()
    except ConnectError:  # host keys refused, or a jump host's failure already explained
        raise
    except paramiko.BadHostKeyException as exc:
        raise changed_key_error(where, known_hosts, exc) from None
    except paramiko.AuthenticationException as exc:
        raise ConnectError(f"{where}: authentication failed for user {connection.user!r}: {exc}") from None
    except TimeoutError:
        raise ConnectError(f"{where}: no answer within {host.connect_timeout:g} s (host down or "
                           "network partitioned?)") from None
    except ConnectionRefusedError:
        raise ConnectError(f"{where}: connection refused (is sshd running on port {connection.port}?)") from None
    except (OSError, paramiko.SSHException) as exc:
        if time.monotonic() - started >= host.connect_timeout * 0.9:
            # paramiko reports a banner that never came as a later, vaguer error
            raise ConnectError(f"{where}: no answer within {host.connect_timeout:g} s (host down, hung "
                               "or network partitioned?)") from None
        raise ConnectError(f"{where}: {type(exc).__name__}: {exc}") from None


class SSHConnection:
    """One SSH transport to a host; every command of one specops task shares it."""

    def __init__(self, host: Host, *, accept_new_host_key: bool = False, inventory: Inventory | None = None):
        self.host = host
        self.round_trips = 0
        self.fabric = _fabric_connection(host, inventory, accept_new_host_key)
        self._where = self.fabric.where
        self._probe = liveness.LivenessProbe()
        try:
            open_explained(self.fabric)
        except BaseException:
            self.close()
            raise
        self.transport.set_keepalive(KEEPALIVE_S)

    @property
    def transport(self) -> paramiko.Transport:
        transport = self.fabric.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectError(f"{self._where}: connection lost")
        return transport

    def _open(self, argv, cwd, env) -> paramiko.Channel:
        transport = self.transport
        self.round_trips += 1
        try:
            channel = transport.open_session(timeout=self.host.connect_timeout)
            channel.settimeout(liveness.POLL_S)
            channel.exec_command(shell_command(argv, cwd, env))
        except (OSError, paramiko.SSHException) as exc:
            raise ConnectError(f"{self._where}: could not start a command: {exc}") from None
        return channel

    def _drive(self, argv, cwd, env, stdin, timeout, on_stdout, on_stderr) -> int:
        channel = self._open(argv, cwd, env)
        return liveness.drive(channel, self.fabric.transport, self._probe, where=self._where,
                              dead_after=self.host.channel_timeout, stdin=stdin, timeout=timeout,
                              on_stdout=on_stdout, on_stderr=on_stderr)

    def run(self, argv, *, cwd=None, env=None, stdin=None, timeout=None) -> CommandResult:
        out, err = bytearray(), bytearray()
        code = self._drive(argv, cwd, env, stdin, timeout, out.extend, err.extend)
        return CommandResult(code, bytes(out), bytes(err))

    def stream(self, argv, *, on_stdout, on_stderr=None, cwd=None, env=None, timeout=None) -> int:
        return self._drive(argv, cwd, env, None, timeout, on_stdout, on_stderr or (lambda _data: None))

    def sftp(self) -> paramiko.SFTPClient:
        """fabric's one SFTP session on this connection (closed with it)."""
        return self.fabric.sftp()

    def download(self, remote_path: str, local_path: Path) -> None:
        try:
            self.sftp().get(remote_path, str(local_path))
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectError(f"{self._where}: download of {remote_path} failed: {exc}") from None

    def upload(self, data: bytes, remote_path: str) -> None:
        upload_through_shell(self, data, remote_path, self._where)  # the folder made too, as `local` does

    def close(self) -> None:
        connection: fabric.Connection | None = self.fabric
        while connection:  # the target first, then each gateway it went through
            connection.close()
            connection = connection.gateway or None

    def __enter__(self) -> SSHConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
