"""Connections to hosts: SSH (paramiko) or local (no SSH), behind one interface.

Both kinds run the same shell command string (built from argument lists with shlex), so a local
host exercises exactly the code path of a remote one. One connection serves every step of one
command. SSH specifics handled here: host keys verified against known_hosts (an unknown key is
refused unless `accept_new_host_key`, which records it, like OpenSSH's accept-new); TCP_NODELAY
(Nagle adds ~30 ms per round trip); connect, banner, auth and channel timeouts, so a dead or
partitioned host is a clear error in seconds; optional jump host; ~/.ssh/config aliases.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import paramiko

from remote import journal
from remote.errors import ConnectError, HostKeyError
from remote.inventory import Host, Inventory

READ_CHUNK = 65536
_POLL_S = 1.0  # how often a quiet command's connection is checked for life


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


def shell_command(argv: Sequence[str], cwd: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """One POSIX shell command line from an argument list: every piece is quoted."""
    if not argv:
        raise ValueError("empty command")
    parts: list[str] = []
    if cwd:
        parts.append(f"cd -- {shlex.quote(cwd)} &&")
    parts.append("exec")
    if env:
        parts.append("env")
        for key, value in env.items():
            if not key.replace("_", "a").isalnum():
                raise ValueError(f"bad environment variable name {key!r}")
            parts.append(shlex.quote(f"{key}={value}"))
    parts.append(shlex.join(argv))
    return " ".join(parts)


class Connection(Protocol):
    host: Host
    round_trips: int

    def run(self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
            stdin: bytes | None = None, timeout: float | None = None) -> CommandResult: ...

    def stream(self, argv: Sequence[str], *, on_stdout: Callable[[bytes], None],
               on_stderr: Callable[[bytes], None] | None = None, cwd: str | None = None,
               env: Mapping[str, str] | None = None, timeout: float | None = None) -> int: ...

    def close(self) -> None: ...


class LocalConnection:
    """Runs commands on this machine through `bash -c`, exactly as sshd would run them."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.round_trips = 0

    def run(self, argv, *, cwd=None, env=None, stdin=None, timeout=None) -> CommandResult:
        self.round_trips += 1
        proc = subprocess.run(["bash", "-c", shell_command(argv, cwd, env)], input=stdin or b"",
                              capture_output=True, timeout=timeout)
        return CommandResult(proc.returncode, proc.stdout, proc.stderr)

    def stream(self, argv, *, on_stdout, on_stderr=None, cwd=None, env=None, timeout=None) -> int:
        self.round_trips += 1
        proc = subprocess.Popen(["bash", "-c", shell_command(argv, cwd, env)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        err_thread = threading.Thread(target=_pump, args=(proc.stderr, on_stderr), daemon=True)
        err_thread.start()
        try:
            while chunk := proc.stdout.read1(READ_CHUNK):  # type: ignore[attr-defined]
                on_stdout(chunk)
            return proc.wait()
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
            err_thread.join(timeout=1)

    def close(self) -> None:
        pass

    def __enter__(self) -> LocalConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pump(pipe, callback) -> None:
    while chunk := pipe.read1(READ_CHUNK):
        if callback:
            callback(chunk)


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _RefuseUnknownKey(paramiko.MissingHostKeyPolicy):
    def __init__(self, host: Host, known_hosts: Path) -> None:
        self.host, self.known_hosts = host, known_hosts

    def missing_host_key(self, client, hostname, key) -> None:
        raise HostKeyError(
            f"{self.host.name} ({hostname}): host key not in {self.known_hosts} — refused. "
            f"Check the fingerprint {key.get_name()} {fingerprint(key)} with the host's owner, then run "
            f"again with --accept-new-host-key to record it")


class _AcceptNewKey(paramiko.MissingHostKeyPolicy):
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


@dataclass(frozen=True)
class _Target:
    hostname: str
    port: int
    user: str | None
    identity_files: tuple[str, ...]


def _ssh_config() -> paramiko.SSHConfig | None:
    path = Path("~/.ssh/config").expanduser()
    return paramiko.SSHConfig.from_path(str(path)) if path.exists() else None


def _resolve_target(host: Host) -> _Target:
    assert host.address
    looked_up: dict = {}
    config = _ssh_config()
    if config is not None:
        looked_up = config.lookup(host.address)
    hostname = looked_up.get("hostname", host.address)
    port = host.port or int(looked_up.get("port", 22))
    user = host.user or looked_up.get("user")
    identities = [host.identity_file] if host.identity_file else list(looked_up.get("identityfile", []))
    return _Target(hostname, port, user, tuple(os.path.expanduser(path) for path in identities))


def _jump_host(host: Host, inventory: Inventory | None) -> Host | None:
    if not host.jump:
        return None
    if inventory is not None and host.jump in inventory.hosts:
        return inventory.hosts[host.jump]
    user, _, rest = host.jump.rpartition("@")
    address, _, port = rest.partition(":")
    return Host(name=f"jump:{host.jump}", address=address, user=user or None, port=int(port) if port else None,
                identity_file=host.identity_file, known_hosts=host.known_hosts, workdir="/", python="python3",
                connect_timeout=host.connect_timeout, channel_timeout=host.channel_timeout)


class SSHConnection:
    """One SSH transport to a host; every command of one specops command shares it."""

    def __init__(self, host: Host, *, accept_new_host_key: bool = False, inventory: Inventory | None = None):
        self.host = host
        self.round_trips = 0
        self._jump: SSHConnection | None = None
        target = _resolve_target(host)
        where = f"{host.name} ({target.hostname}:{target.port})"
        known_hosts = Path(host.known_hosts).expanduser()
        client = paramiko.SSHClient()
        if known_hosts.exists():
            client.load_host_keys(str(known_hosts))
        policy_class = _AcceptNewKey if accept_new_host_key else _RefuseUnknownKey
        client.set_missing_host_key_policy(policy_class(host, known_hosts))
        jump = _jump_host(host, inventory)
        started = time.monotonic()
        try:
            if jump is not None:
                self._jump = SSHConnection(jump, accept_new_host_key=accept_new_host_key, inventory=inventory)
                transport = self._jump._client.get_transport()
                assert transport is not None
                sock = transport.open_channel("direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0),
                                              timeout=host.connect_timeout)
            else:
                sock = socket.create_connection((target.hostname, target.port), timeout=host.connect_timeout)
                if os.environ.get("SPECOPS_TCP_NODELAY", "1") != "0":  # off only to measure Nagle's cost
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client.connect(
                target.hostname, port=target.port, username=target.user, sock=sock,
                key_filename=list(target.identity_files) or None, look_for_keys=not target.identity_files,
                allow_agent=not target.identity_files, timeout=host.connect_timeout,
                banner_timeout=host.connect_timeout, auth_timeout=host.connect_timeout,
                channel_timeout=host.connect_timeout,
            )
        except HostKeyError:
            self._close_jump()
            raise
        except paramiko.BadHostKeyException as exc:
            self._close_jump()
            raise HostKeyError(
                f"{where}: host key CHANGED — refused. known_hosts {known_hosts} has "
                f"{exc.expected_key.get_name()} {fingerprint(exc.expected_key)}, the host offered "
                f"{exc.key.get_name()} {fingerprint(exc.key)}. If the host was really reinstalled, remove its "
                f"line from {known_hosts} and accept the new key explicitly") from None
        except paramiko.AuthenticationException as exc:
            self._close_jump()
            raise ConnectError(f"{where}: authentication failed for user {target.user!r}: {exc}") from None
        except TimeoutError:
            self._close_jump()
            raise ConnectError(f"{where}: no answer within {host.connect_timeout:g} s (host down or "
                               "network partitioned?)") from None
        except ConnectionRefusedError:
            self._close_jump()
            raise ConnectError(f"{where}: connection refused (is sshd running on port {target.port}?)") from None
        except (OSError, paramiko.SSHException) as exc:
            self._close_jump()
            if time.monotonic() - started >= host.connect_timeout * 0.9:
                # paramiko reports a banner that never came as a later, vaguer error
                raise ConnectError(f"{where}: no answer within {host.connect_timeout:g} s (host down, hung or "
                                   "network partitioned?)") from None
            raise ConnectError(f"{where}: {type(exc).__name__}: {exc}") from None
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(5)
        self._client = client
        self._where = where
        self._probe: threading.Thread | None = None
        self._last_reply = 0.0

    def _close_jump(self) -> None:
        if self._jump is not None:
            self._jump.close()

    def _open(self, argv, cwd, env) -> paramiko.Channel:
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectError(f"{self._where}: connection lost")
        self.round_trips += 1
        try:
            channel = transport.open_session(timeout=self.host.connect_timeout)
            channel.settimeout(_POLL_S)
            channel.exec_command(shell_command(argv, cwd, env))
        except (OSError, paramiko.SSHException) as exc:
            raise ConnectError(f"{self._where}: could not start a command: {exc}") from None
        return channel

    def run(self, argv, *, cwd=None, env=None, stdin=None, timeout=None) -> CommandResult:
        out, err = bytearray(), bytearray()
        code = self._drive(argv, cwd, env, stdin, timeout, out.extend, err.extend)
        return CommandResult(code, bytes(out), bytes(err))

    def stream(self, argv, *, on_stdout, on_stderr=None, cwd=None, env=None, timeout=None) -> int:
        return self._drive(argv, cwd, env, None, timeout, on_stdout, on_stderr or (lambda _data: None))

    def _probe_liveness(self) -> None:
        """Ask the server for a reply (OpenSSH answers any global request): proof the link is up.

        A quiet command is not a dead connection: liveness is judged by these replies, never by
        the command's own output. The request runs in a thread, since paramiko waits for the reply
        without a deadline; closing the transport ends it.
        """
        if self._probe is not None and self._probe.is_alive():
            return
        transport = self._client.get_transport()

        def ask() -> None:
            try:
                if transport is not None:
                    transport.global_request("keepalive@openssh.com", wait=True)
                    self._last_reply = time.monotonic()
            except Exception:  # a dead transport: the caller's deadline reports it
                pass

        self._probe = threading.Thread(target=ask, daemon=True)
        self._probe.start()

    def _drive(self, argv, cwd, env, stdin, timeout, on_stdout, on_stderr) -> int:
        channel = self._open(argv, cwd, env)
        started = last_sign = time.monotonic()
        dead_after = self.host.channel_timeout

        def check_alive() -> None:
            nonlocal last_sign
            now = time.monotonic()
            last_sign = max(last_sign, self._last_reply)
            if now - last_sign > dead_after:
                raise ConnectError(f"{self._where}: no data from the host for {dead_after:g} s and no answer to "
                                   "keepalives (connection dead?)")
            if timeout is not None and now - started > timeout:
                raise ConnectError(f"{self._where}: the command did not finish within {timeout:g} s")
            self._probe_liveness()  # one keepalive in flight at a time, each second of silence

        try:
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            while True:
                if channel.recv_stderr_ready():
                    on_stderr(channel.recv_stderr(READ_CHUNK))
                    last_sign = time.monotonic()
                    continue
                try:
                    data = channel.recv(READ_CHUNK)
                except TimeoutError:
                    check_alive()
                    continue
                if not data:
                    break
                last_sign = time.monotonic()
                on_stdout(data)
            while True:
                try:
                    chunk = channel.recv_stderr(READ_CHUNK)
                except TimeoutError:
                    check_alive()
                    continue
                if not chunk:
                    break
                on_stderr(chunk)
            while not channel.exit_status_ready():
                check_alive()
                time.sleep(0.005)
            code = channel.recv_exit_status()
            return 255 if code == -1 else code
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectError(f"{self._where}: connection lost: {exc}") from None
        finally:
            channel.close()

    def close(self) -> None:
        self._client.close()
        self._close_jump()

    def __enter__(self) -> SSHConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_connection(host: Host, *, accept_new_host_key: bool = False,
                    inventory: Inventory | None = None) -> LocalConnection | SSHConnection:
    """A connection to `host`; use it as a context manager."""
    if host.is_local:
        return LocalConnection(host)
    return SSHConnection(host, accept_new_host_key=accept_new_host_key, inventory=inventory)
