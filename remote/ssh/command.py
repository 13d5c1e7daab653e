"""What every connection kind shares: the command result, the quoted shell line, the interface."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from remote.errors import ConnectError

if TYPE_CHECKING:
    from pathlib import Path

    from remote.inventory import Host

READ_CHUNK = 65536


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


def dead_connection(where: str, dead_after: float) -> str:
    """The one line for a connection that went silent, whichever client noticed (paramiko or OpenSSH)."""
    return f"{where}: no data from the host for {dead_after:g} s and no answer to keepalives (connection dead?)"


def upload_through_shell(conn: Connection, data: bytes, remote_path: str, where: str) -> None:
    """put over a command channel: `cat` into the file on the host, through the connection's own run."""
    result = conn.run(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "upload", remote_path], stdin=data)
    if result.exit_code != 0:
        raise ConnectError(f"{where}: upload to {remote_path} failed: {result.stderr.decode(errors='replace')}")


def pump(pipe, callback: Callable[[bytes], None] | None) -> None:
    """Read a subprocess's pipe to its end, handing each chunk to `callback` (dropped when None)."""
    while chunk := pipe.read1(READ_CHUNK):
        if callback:
            callback(chunk)


class Connection(Protocol):
    """A host to run commands on: `local` (bash here) or SSH (fabric), the same calls either way."""

    host: Host
    round_trips: int

    def run(self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
            stdin: bytes | None = None, timeout: float | None = None) -> CommandResult: ...

    def stream(self, argv: Sequence[str], *, on_stdout: Callable[[bytes], None],
               on_stderr: Callable[[bytes], None] | None = None, cwd: str | None = None,
               env: Mapping[str, str] | None = None, timeout: float | None = None) -> int: ...

    def download(self, remote_path: str, local_path: Path) -> None:
        """get: the host's file `remote_path` as `local_path` here."""
        ...

    def upload(self, data: bytes, remote_path: str) -> None:
        """put: `data` as the host's file `remote_path` (its folder made); ConnectError when it cannot be."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Connection: ...

    def __exit__(self, *exc: object) -> None: ...
