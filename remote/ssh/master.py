"""An SSH host through the OpenSSH client and a shared master: the connection of quick tasks.

A task of one or two agent calls (`invoke status`, `doctor`, `patch status`) pays, over paramiko,
the import of fabric + paramiko + cryptography and a fresh handshake: more than the whole of
`ssh H true` (bench/phases.py). Through OpenSSH's ControlMaster (remote.ssh.openssh: ControlMaster
=auto, ControlPersist, a private socket named by a hash of every option and of known_hosts) the
first quick task opens a master as cheaply as paramiko would connect, and every later one, or an
`invoke sync`, rides it without a handshake until it has been idle for SPECOPS_SSH_PERSIST seconds.

The host key is verified by OpenSSH when a master opens (StrictHostKeyChecking=yes against the
inventory's known_hosts alone; an edited known_hosts names another socket). A login that fails is
explained by opening the same host with our fabric connection, which words every failure as the
rest of specops does (unknown key with its fingerprint, changed key, authentication, refused); when
that connection works the task goes on through it, so a broken master never fails a task. A
command whose session broke before it printed anything may run twice that way: only tasks whose
commands are safe to repeat (reads, the doctor) ask for this connection.
"""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from remote.errors import ConnectError
from remote.ssh.command import (
    READ_CHUNK,
    CommandResult,
    Connection,
    dead_connection,
    pump,
    shell_command,
    upload_through_shell,
)
from remote.ssh.openssh import client_argv, control_socket, destination, master_options
from remote.ssh.target import resolve_target

if TYPE_CHECKING:
    from remote.inventory import Host, Inventory

SSH_FAILED = 255  # OpenSSH's own exit status; the agent never uses it
LOG_LIMIT = 65536  # a master's log is emptied past this (it only ever holds failures)
# ssh's words for a login that never reached a command: explained (or retried) through fabric
_LOGIN_FAILED = re.compile(r"host key|Permission denied|Connection refused|kex_exchange_identification|"
                           r"Could not resolve|No route|Connection closed by|banner exchange|"
                           r"Control socket|mux_client", re.IGNORECASE)
_NO_ANSWER = re.compile(r"timed out", re.IGNORECASE)  # connect or banner: the host never answered
_WENT_SILENT = re.compile(r"Timeout, server .* not responding", re.IGNORECASE)  # keepalives unanswered


def shared_connection(host: Host, inventory: Inventory | None, *,
                      accept_new_host_key: bool) -> MasterConnection | None:
    """The quick connection to an SSH host, or None: sharing is off (or its folder unsafe), or a new host
    key is to be accepted (paramiko's job: it records the key and journals it)."""
    if accept_new_host_key:
        return None
    client = client_argv(host, inventory)
    socket_path = control_socket(host, client[1:])
    return None if socket_path is None else MasterConnection(host, inventory, client, socket_path)


class MasterConnection:
    """Commands through `ssh` and the shared master at `socket_path`; the same calls as every connection."""

    def __init__(self, host: Host, inventory: Inventory | None, client: list[str], socket_path: Path) -> None:
        self.host, self.inventory = host, inventory
        self.round_trips = 0
        target = resolve_target(host)
        self._where = f"{host.name} ({target.hostname}:{target.port})"
        # ssh's own messages go to a log beside the socket: a mux client says nothing when its master
        # dies, the master writes why (a keepalive timeout) there, whichever task opened it.
        self._log = socket_path.with_name(f"{socket_path.name}.log")
        self._ssh = [*client, *master_options(socket_path), "-E", str(self._log), "-T", "--", destination(host)]
        self._fallback: Connection | None = None

    def _log_offset(self) -> int:
        try:
            size = self._log.stat().st_size
        except FileNotFoundError:
            return 0
        if size > LOG_LIMIT:
            self._log.write_bytes(b"")
            return 0
        return size

    def _messages(self, stderr: bytes, offset: int) -> bytes:
        """What ssh said about this call: its stderr and what it (or its master) logged since `offset`."""
        try:
            with open(self._log, "rb") as log:
                log.seek(offset)
                return stderr + log.read()
        except FileNotFoundError:
            return stderr

    def run(self, argv, *, cwd=None, env=None, stdin=None, timeout=None) -> CommandResult:
        if self._fallback is None:
            out, err = bytearray(), bytearray()
            code = self._drive(argv, cwd, env, stdin, timeout, out.extend, err.extend)
            if code is not None:
                return CommandResult(code, bytes(out), bytes(err))
        assert self._fallback is not None
        return self._fallback.run(argv, cwd=cwd, env=env, stdin=stdin, timeout=timeout)

    def stream(self, argv, *, on_stdout, on_stderr=None, cwd=None, env=None, timeout=None) -> int:
        if self._fallback is None:
            code = self._drive(argv, cwd, env, None, timeout, on_stdout, on_stderr)
            if code is not None:
                return code
        assert self._fallback is not None
        return self._fallback.stream(argv, on_stdout=on_stdout, on_stderr=on_stderr, cwd=cwd, env=env,
                                     timeout=timeout)

    def _drive(self, argv: Sequence[str], cwd: str | None, env: Mapping[str, str] | None, stdin: bytes | None,
               timeout: float | None, on_stdout: Callable[[bytes], None],
               on_stderr: Callable[[bytes], None] | None) -> int | None:
        """Run one command; its exit status, or None when ssh could not run it and the fallback
        connection (set by `_explain`) is to run it instead."""
        self.round_trips += 1
        offset = self._log_offset()
        proc = subprocess.Popen([*self._ssh, shell_command(argv, cwd, env)],
                                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        errors = bytearray()
        got_output = False

        def on_err(chunk: bytes) -> None:
            errors.extend(chunk)
            if on_stderr:
                on_stderr(chunk)

        helpers = [threading.Thread(target=pump, args=(proc.stderr, on_err), daemon=True)]
        if stdin:
            helpers.append(threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True))
        for helper in helpers:
            helper.start()
        timer = threading.Timer(timeout, proc.kill) if timeout else None
        if timer:
            timer.start()
        try:
            while chunk := proc.stdout.read1(READ_CHUNK):  # type: ignore[attr-defined]
                got_output = True
                on_stdout(chunk)
            code = proc.wait()
        finally:
            if timer:
                timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for helper in helpers:
                helper.join(timeout=1)
        if timer is not None and code < 0:
            raise ConnectError(f"{self._where}: the command did not finish within {timeout:g} s")
        if code == SSH_FAILED and not got_output:
            self._explain(self._messages(bytes(errors), offset))
            return None
        return code

    def _explain(self, stderr: bytes) -> None:
        """ssh could not run the command: say why in specops' words, or go on through fabric."""
        text = stderr.decode(errors="replace").strip()
        if _WENT_SILENT.search(text):
            raise ConnectError(dead_connection(self._where, self.host.channel_timeout))
        if _NO_ANSWER.search(text):
            raise ConnectError(f"{self._where}: no answer within {self.host.connect_timeout:g} s (host down or "
                               "network partitioned?)")
        if not _LOGIN_FAILED.search(text):
            last = text.splitlines()[-1] if text else "ssh exited 255"
            raise ConnectError(f"{self._where}: connection lost: {last}")
        from remote.ssh.connection import SSHConnection

        # Raises the explained error (host key, authentication, refused...), or works: then use it.
        self._fallback = SSHConnection(self.host, inventory=self.inventory)

    def download(self, remote_path: str, local_path: Path) -> None:
        with open(local_path, "wb") as sink:
            code = self.stream(["cat", "--", remote_path], on_stdout=sink.write)
        if code != 0:
            raise ConnectError(f"{self._where}: download of {remote_path} failed (exit {code})")

    def upload(self, data: bytes, remote_path: str) -> None:
        upload_through_shell(self, data, remote_path, self._where)

    def close(self) -> None:
        # The master stays up for the next task (ControlPersist); only a fallback connection is ours.
        if self._fallback is not None:
            self._fallback.close()
            self._fallback = None

    def __enter__(self) -> MasterConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _feed(pipe, data: bytes) -> None:
    """Write a command's stdin and close it (the remote side may stop reading early)."""
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, OSError):
        pass
