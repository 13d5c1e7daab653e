"""Jobs on a host, from the workstation: launch, list, stop, and follow a job's log.

The host keeps the truth (`python -m specops job ...`); this side only asks. Following a log is
resumable by byte offset: after a dropped connection it reconnects and asks for what follows the
last offset it saw, so every line is printed exactly once. The log is mirrored into
logs/<host>/<job-id>.log, written at the host's byte positions, so the mirror is the host's log
no matter how often following was interrupted.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote import journal
from remote.agent import agent_call, agent_stream
from remote.errors import AgentError, BadInput, ConnectError
from remote.inventory import Host, Inventory
from remote.names import inside, safe_name
from remote.session import HostSession
from specops.contract import commandline
from specops.contract.protocol import ACTIVE_STATES

_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
_BACKWARD_BLOCK = 1 << 16


def _agent_failure(host: Host, document: dict[str, Any], exit_code: int) -> Exception:
    message = f"{host.name}: {document.get('error', 'the agent failed')}"
    return BadInput(message) if exit_code == 2 else AgentError(message)


def job_call(conn: Any, host: Host, argv: Sequence[str]) -> dict[str, Any]:
    """One `job ...` agent command (argv from specops.contract.commandline); its document, or its one-line
    error raised."""
    result = agent_call(conn, host, argv)
    if result.exit_code != 0 or result.document.get("ok") is False:
        raise _agent_failure(host, result.document, result.exit_code)
    return result.document


def logs_root() -> Path:
    return journal.journal_path().parent


def mirror_path(host: Host, job_id: str) -> Path:
    """logs/<host>/<job>.log; the job id comes from the host, so it is checked like a name."""
    return inside(logs_root(), safe_name(host.name, "host"), f"{safe_name(job_id, 'job id')}.log",
                  what="log mirror")


class LogMirror:
    """A local copy of a host's job log, written at the host's byte offsets (so writes are idempotent)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    @property
    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def write(self, end_offset: int, raw: bytes) -> None:
        os.pwrite(self._fd, raw, end_offset - len(raw))

    def read(self, start: int, end: int) -> bytes:
        return os.pread(self._fd, max(0, end - start), start)

    def clear(self) -> None:
        os.ftruncate(self._fd, 0)

    def offset_of_last_lines(self, count: int) -> int:
        """Where the last `count` '\\n'-terminated lines start (a trailing partial line follows them)."""
        seen, position = 0, self.size
        while position > 0:
            step = min(_BACKWARD_BLOCK, position)
            position -= step
            block = self.read(position, position + step)
            index = len(block)
            while (index := block.rfind(b"\n", 0, index)) >= 0:
                seen += 1
                if seen == count + 1:
                    return position + index + 1
        return 0

    def close(self) -> None:
        os.close(self._fd)


@dataclass
class FollowOutcome:
    job_id: str
    offset: int  # bytes of the host's log received (and mirrored)
    state: str | None  # the job's state when following ended
    exit_code: int | None
    interrupted: bool  # Ctrl-C: following stopped, the job itself was not touched
    reconnects: int
    mirror: Path


def follow_log(host: Host, job: str, offset: int | None, on_text: Callable[[str], None], reconnect: bool = True,
               *, lines: int | None = None, follow: bool = True, inventory: Inventory | None = None,
               on_notice: Callable[[str], None] | None = None, reconnect_timeout_s: float = 300.0,
               session: HostSession | None = None, record: dict[str, Any] | None = None) -> FollowOutcome:
    """Print a job's log from byte `offset` (or its last `lines` lines) through `on_text`.

    With `follow`, until the job ends; a dropped connection is reconnected (for up to
    `reconnect_timeout_s` of failed attempts in a row) and resumed at the last offset seen.
    Ctrl-C (KeyboardInterrupt) only ends the following: the outcome says `interrupted`.
    `session` is the task's connection (one of its own otherwise, closed at the end); `record`,
    the job's record when the caller has it (a launch just returned it), saves asking the host.
    """
    notice = on_notice or (lambda _text: None)
    follower = _Follower(host, job, offset, lines, on_text)
    own_session = session is None
    link = session if session is not None else HostSession(host, inventory)
    reconnects = 0
    failing_since: float | None = None
    try:
        while True:
            received_before = follower.received
            try:
                conn = link.conn
                if follower.mirror is None:
                    follower.start(record if record is not None
                                   else job_call(conn, host, commandline.job_show(job=job))["job"])
                follower.run(conn, follow=follow)
                if follower.finished(follow):
                    return follower.outcome(interrupted=False, reconnects=reconnects)
                problem = f"{host.name}: the log stream ended early"
            except ConnectError as exc:
                if not reconnect:
                    raise
                problem = str(exc)
            link.reconnect()  # a real drop (or a stream cut short): the next attempt opens a fresh connection
            if follower.received > received_before:  # it was making progress: a fresh drop
                failing_since = None
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > reconnect_timeout_s:
                raise ConnectError(f"{problem} (gave up reconnecting after {reconnect_timeout_s:g} s)")
            notice(f"{problem}; reconnecting to resume at byte {follower.received}")
            time.sleep(_BACKOFF_S[min(reconnects, len(_BACKOFF_S) - 1)])
            reconnects += 1
    except KeyboardInterrupt:
        return follower.outcome(interrupted=True, reconnects=reconnects)
    finally:
        follower.close()
        if own_session:
            link.close()


class _Follower:
    """The state of one `follow_log`: what was received, mirrored and shown."""

    def __init__(self, host: Host, job: str, offset: int | None, lines: int | None,
                 on_text: Callable[[str], None]) -> None:
        self.host, self.job_id, self.on_text = host, job, on_text
        self.lines = lines if offset is None else None
        self.show_from: int | None = None if self.lines is not None else (offset or 0)
        self.mirror: LogMirror | None = None
        self.done: dict[str, Any] | None = None

    @property
    def received(self) -> int:
        return self.mirror.size if self.mirror else 0

    def start(self, record: dict[str, Any]) -> None:
        self.job_id = record["id"]
        self.mirror = LogMirror(mirror_path(self.host, self.job_id))
        if self.show_from is not None and self.show_from < self.mirror.size:  # already here from before
            self._show(self.mirror.read(self.show_from, self.mirror.size))

    def run(self, conn: Any, *, follow: bool) -> None:
        """Catch up (and with --lines, show the last lines), then follow if asked and still running."""
        assert self.mirror is not None
        self.done = None
        if self.show_from is None:  # --lines: where to start is known once the mirror caught up
            if not self._pass(conn, follow=False):
                return
            assert self.lines is not None and self.done is not None
            self.show_from = self.mirror.offset_of_last_lines(self.lines)
            self._show(self.mirror.read(self.show_from, self.mirror.size))
            if not follow or self.done["state"] not in ACTIVE_STATES:
                return
            self.done = None
        self._pass(conn, follow=follow)

    def _pass(self, conn: Any, *, follow: bool) -> bool:
        """One `job tail` from the end of the mirror; False when the mirror had to be reset."""
        assert self.mirror is not None
        argv = commandline.job_tail(job=self.job_id, offset=self.mirror.size, follow=follow)
        errors: list[dict[str, Any]] = []
        code = agent_stream(conn, self.host, argv,
                            lambda document: self._receive(document, errors))
        if not errors:
            return True
        if "outside the log" in errors[0].get("error", "") and self.mirror.size:
            self.mirror.clear()  # the host's log is shorter than our copy: not the same log
            self.show_from = 0 if self.show_from is not None else None
            return False
        raise _agent_failure(self.host, errors[0], code)

    def _receive(self, document: dict[str, Any], errors: list[dict[str, Any]]) -> None:
        assert self.mirror is not None
        if document.get("ok") is False:
            errors.append(document)
        elif "data" in document:
            raw = document["data"].encode("utf-8", "surrogateescape")
            start = document["offset"] - len(raw)
            self.mirror.write(document["offset"], raw)
            if self.show_from is not None and document["offset"] > self.show_from:
                self._show(raw[max(0, self.show_from - start):])
        elif document.get("done"):
            self.done = document

    def _show(self, raw: bytes) -> None:
        if raw:
            self.on_text(raw.decode("utf-8", "replace"))

    def finished(self, follow: bool) -> bool:
        if self.done is None:
            return False
        return not follow or self.done["state"] not in ACTIVE_STATES

    def outcome(self, *, interrupted: bool, reconnects: int) -> FollowOutcome:
        done = self.done or {}
        path = self.mirror.path if self.mirror else mirror_path(self.host, self.job_id)
        return FollowOutcome(self.job_id, self.received, done.get("state"), done.get("exit_code"), interrupted,
                             reconnects, path)

    def close(self) -> None:
        if self.mirror is not None:
            self.mirror.close()
