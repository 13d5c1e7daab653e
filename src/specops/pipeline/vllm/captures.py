"""Captures nobody asked for, discarded: the run's one server answers regenerate's chat requests too.

The run's server is the extraction server (vLLM's `extract_hidden_states` method and its hidden-states
connector), so that regenerate and extract share ONE load of the target. That server writes every
request's prompt hidden states to `<staging>/<request id>.safetensors` (a `.lock` beside it held while
the writer thread writes); a chat answer's capture is of no use. While regenerate's client runs, a
sweeper removes each finished capture (its lock free) every second, so the staging folder holds at most
the requests in flight (`regenerate.concurrency` of them) instead of one file per conversation (at
Kimi's 57 KB a token, 10k prompts of 500 tokens would be 290 GB); when the client has ended, every
capture left is awaited (its lock) and removed. Extraction's own files never meet these: the steps of a
run are exclusive on a host, and speculators moves each of its captures out of staging as it comes.
Whatever is still there when the server job is stopped is nobody's: the stop sweeps it (`sweep_stopped`).
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from types import TracebackType

CAPTURE = "*.safetensors"
LOCK = ".lock"


def _finished(lock: Path, wait: bool) -> bool:
    """The capture whose lock this is has been written (its writer released the lock), or it has no lock."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if wait else fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def sweep(staging: Path, *, wait: bool = False) -> tuple[int, int]:
    """Remove the finished captures in `staging` (with `wait`: every capture, each awaited; and stray locks).
    Returns (files removed, bytes removed)."""
    removed = size = 0
    if not staging.is_dir():
        return 0, 0
    for capture in sorted(staging.glob(CAPTURE)):
        lock = capture.with_name(capture.name + LOCK)
        if not _finished(lock, wait):
            continue
        try:
            size += capture.stat().st_size
            capture.unlink()
            removed += 1
        except FileNotFoundError:
            continue
        lock.unlink(missing_ok=True)
    if wait:  # a capture still to be written has only its lock yet (the writer holds it): await, then remove both
        for lock in staging.glob("*" + LOCK):
            if _finished(lock, True):
                capture = lock.with_name(lock.name.removesuffix(LOCK))
                if capture.is_file():
                    size += capture.stat().st_size
                    capture.unlink(missing_ok=True)
                    removed += 1
                lock.unlink(missing_ok=True)
    return removed, size


def sweep_stopped(record: dict) -> str | None:
    """A stopped server job's staging folder swept: a capture left there now is one no client will move (its
    request died with the server, or its client was killed before it moved it); at Kimi's size each is
    megabytes. What was removed, in words (None: nothing)."""
    staging = ((record.get("meta") or {}).get("server") or {}).get("staging")
    removed, size = sweep(Path(staging)) if staging else (0, 0)
    return (f"removed {removed} capture(s) ({size:,} bytes) that no client moved from the stopped server's "
            f"staging folder {staging}") if removed else None


class Discarded:
    """`with Discarded(staging):` captures made meanwhile are removed as they finish, the rest at the end."""

    def __init__(self, staging: Path, interval_s: float = 1.0) -> None:
        self.staging, self.interval_s = staging, interval_s
        self.removed = self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="discard-captures", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._count(sweep(self.staging))

    def _count(self, swept: tuple[int, int]) -> None:
        self.removed += swept[0]
        self.bytes += swept[1]

    def __enter__(self) -> Discarded:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self._count(sweep(self.staging, wait=True))

    def describe(self) -> dict[str, int]:
        return {"captures_discarded": self.removed, "capture_bytes_discarded": self.bytes}
