"""Process groups of jobs: is anything left of one, and ending all of it.

A job's command runs as the leader of its own process group, so signalling the group reaches every
child that did not deliberately leave it, including children that ignore SIGHUP (which is all
that tmux kill-session sends).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_POLL_S = 0.05


def boot_id() -> str | None:
    """Identifies this boot: a recorded pgid from an earlier boot names someone else's processes."""
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return None


def group_alive(pgid: int | None, recorded_boot_id: str | None = None) -> bool:
    if not pgid or pgid <= 1:
        return False
    if recorded_boot_id and recorded_boot_id != boot_id():
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def wait_group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def terminate_group(pgid: int, grace_s: float) -> str | None:
    """SIGTERM the group, then SIGKILL what is left after `grace_s`; the signal that ended it."""
    if not group_alive(pgid):
        return None
    _signal_group(pgid, signal.SIGTERM)
    _signal_group(pgid, signal.SIGCONT)  # a stopped process only acts on SIGTERM once continued
    if wait_group_gone(pgid, grace_s):
        return "SIGTERM"
    _signal_group(pgid, signal.SIGKILL)
    wait_group_gone(pgid, 10)
    return "SIGKILL"
