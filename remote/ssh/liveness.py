"""Running one command on an SSH channel with liveness judged by keepalive replies.

A quiet command is not a dead connection: while nothing arrives, one `keepalive@openssh.com`
global request is kept in flight (OpenSSH answers any), and only when neither output nor a reply
came for the host's `channel_timeout` is the connection declared dead. Invoke's runner only knows
a wall-clock command timeout, so this driver stays ours.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import paramiko

from remote.errors import ConnectError
from remote.ssh.command import READ_CHUNK, dead_connection

POLL_S = 1.0  # how often a quiet command's connection is checked for life


class LivenessProbe:
    """Keepalive requests on one transport, one at a time; remembers when the last reply came."""

    def __init__(self) -> None:
        self.last_reply = 0.0
        self._thread: threading.Thread | None = None

    def ask(self, transport: paramiko.Transport | None) -> None:
        # paramiko waits for the reply without a deadline: ask in a thread; closing the transport ends it.
        if self._thread is not None and self._thread.is_alive():
            return

        def ask() -> None:
            try:
                if transport is not None:
                    transport.global_request("keepalive@openssh.com", wait=True)
                    self.last_reply = time.monotonic()
            except Exception:  # a dead transport: the caller's deadline reports it
                pass

        self._thread = threading.Thread(target=ask, daemon=True)
        self._thread.start()


def drive(channel: paramiko.Channel, transport: paramiko.Transport, probe: LivenessProbe, *, where: str,
          dead_after: float, stdin: bytes | None, timeout: float | None,
          on_stdout: Callable[[bytes], None], on_stderr: Callable[[bytes], None]) -> int:
    """Feed stdin, pump stdout/stderr to the callbacks, return the exit status (255: none given)."""
    started = last_sign = time.monotonic()

    def check_alive() -> None:
        nonlocal last_sign
        now = time.monotonic()
        last_sign = max(last_sign, probe.last_reply)
        if now - last_sign > dead_after:
            raise ConnectError(dead_connection(where, dead_after))
        if timeout is not None and now - started > timeout:
            raise ConnectError(f"{where}: the command did not finish within {timeout:g} s")
        probe.ask(transport)  # one keepalive in flight at a time, each second of silence

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
        raise ConnectError(f"{where}: connection lost: {exc}") from None
    finally:
        channel.close()
