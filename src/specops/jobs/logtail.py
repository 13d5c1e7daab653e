"""Reading a job's log by byte offset, in whole lines, so a reader that resumes at the last offset
it saw gets every line exactly once.

A line ends at '\\n' or at '\\r' (progress bars redraw with '\\r' and would otherwise show nothing
until they finish). Neither byte occurs inside a multi-byte UTF-8 character, so cutting there
never splits one. Only once the job has ended is a trailing partial line sent as it is.
Offsets count bytes of the log; a chunk's bytes are `data.encode("utf-8", "surrogateescape")`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specops.contract.protocol import ACTIVE_STATES

MAX_CHUNK = 1 << 20  # a "line" longer than this goes out in pieces rather than never
_BACKWARD_BLOCK = 1 << 16
_LAST_LINE_WINDOW = 1 << 16
_LAST_LINE_CHARS = 500
_LAST_LINE_SCAN = 1 << 22  # bytes read backwards at most for a human line
_RESULT_WINDOW = 1 << 20  # a step's result document is one line, at most a few hundred KB
INTERNAL_PREFIX = "### specops "  # the trainer's markers for the agent's readers, never shown to people


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def read_chunk(path: Path, offset: int, *, complete: bool) -> tuple[bytes, int]:
    """The bytes after `offset` up to the last line end (all of them when `complete`), new offset."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read(MAX_CHUNK)
    except FileNotFoundError:
        return b"", offset
    if not complete:
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if cut or len(data) < MAX_CHUNK:  # only a line longer than a whole chunk is split
            data = data[:cut]
    return data, offset + len(data)


def offset_of_last_lines(path: Path, count: int) -> int:
    """Where the last `count` whole lines start ('\\n'-terminated; a partial line follows them)."""
    wanted = count + 1  # the newline before the first wanted line
    seen = 0
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return 0
    with handle:
        position = handle.seek(0, os.SEEK_END)
        while position > 0:
            step = min(_BACKWARD_BLOCK, position)
            position -= step
            handle.seek(position)
            block = handle.read(step)
            index = len(block)
            while (index := block.rfind(b"\n", 0, index)) >= 0:
                seen += 1
                if seen == wanted:
                    return position + index + 1
    return 0


def last_line(path: Path) -> str | None:
    """The last non-blank line a person would read, partial or not, for a status table.

    A step ends its log with its JSON result, often kilobytes on one line: that line, and any
    other JSON document on a line of its own, is skipped rather than shown as a fragment. The
    log is read backwards a block at a time; a line cut by the block's start is never shown.
    """
    size = log_size(path)
    if size == 0:
        return None
    with path.open("rb") as handle:
        end = size
        carry = b""  # the start of the line cut by the previous block's start
        while end > 0:
            start = max(0, end - _LAST_LINE_WINDOW)
            handle.seek(start)
            block = handle.read(end - start) + carry
            pieces = block.replace(b"\r", b"\n").split(b"\n")
            carry, whole = (b"", pieces) if start == 0 else (pieces[0], pieces[1:])
            for raw in reversed(whole):
                line = raw.decode(errors="replace").strip()
                if line and not _is_json_document(line) and not line.startswith(INTERNAL_PREFIX):
                    return line[-_LAST_LINE_CHARS:]
            end = start
            if size - end >= _LAST_LINE_SCAN:
                break
    return None


def result_line(path: Path) -> str | None:
    """An ended job's own result, from the JSON document its command printed last: a failure's error, else
    the step and its status ("extract: skipped: unchanged"); None without one."""
    size = log_size(path)
    if size == 0:
        return None
    with path.open("rb") as handle:
        start = max(0, size - _RESULT_WINDOW)
        handle.seek(start)
        lines = handle.read().decode(errors="replace").splitlines()[1 if start else 0:]
    for raw in reversed(lines):
        line = raw.strip()
        if line and _is_json_document(line):
            document = json.loads(line)
            if not isinstance(document, dict):
                return None
            if document.get("error"):
                return str(document["error"])
            step, status = document.get("step"), document.get("status")
            if step and status:
                return f"{step}: {status}"
            steps = document.get("steps")
            if isinstance(steps, dict) and steps:  # a pipeline's summary: its steps by status
                said: dict[str, int] = {}
                for report in steps.values():
                    text = str((report or {}).get("status", "?")) if isinstance(report, dict) else "?"
                    said[text.split(":")[0]] = said.get(text.split(":")[0], 0) + 1
                return "pipeline: " + ", ".join(f"{count} {text}" for text, count in said.items())
            return None
    return None


def _is_json_document(line: str) -> bool:
    if (line[0], line[-1]) not in (("{", "}"), ("[", "]")):
        return False
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def stream(path: Path, offset: int, *, follow: bool, current_state: Callable[[], dict[str, Any]],
           emit: Callable[[dict[str, Any]], None], poll_s: float = 0.2, heartbeat_s: float = 10.0) -> None:
    """Emit {"offset", "data"} chunks from `offset`, then {"done", "state", "exit_code"}.

    Without `follow` that is what the log holds now; with it, until the job has ended. Quiet
    stretches get an empty chunk every `heartbeat_s`: it keeps an SSH channel timeout from firing
    and makes a reader that went away show up here as a broken pipe.
    """
    last_emit = time.monotonic()
    while True:
        # Read the state before the log: once an ended state is seen, the log holds everything.
        state = current_state()
        ended = state["state"] not in ACTIVE_STATES
        sent = False
        while True:
            data, offset = read_chunk(path, offset, complete=ended)
            if not data:
                break
            # surrogateescape keeps bytes that are not UTF-8 recoverable: JSON carries them as
            # \udcXX escapes and the reader's encode(errors="surrogateescape") restores them.
            emit({"offset": offset, "data": data.decode(errors="surrogateescape")})
            sent = True
        if ended or not follow:
            emit({"done": True, "offset": offset, "state": state["state"], "exit_code": state.get("exit_code")})
            return
        now = time.monotonic()
        if sent:
            last_emit = now
        elif now - last_emit >= heartbeat_s:
            emit({"offset": offset, "data": ""})
            last_emit = now
        time.sleep(poll_s)
