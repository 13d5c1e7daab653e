"""Process groups of jobs: is anything left of one, and ending all of it.

A job's command runs as the leader of its own process group, so signalling the group reaches every
child that did not deliberately leave it, including children that ignore SIGHUP (which is all
that tmux kill-session sends). Ending a job also reaches the groups its descendants started on purpose
(torchrun's workers each lead a session of their own).
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


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), None when there is none: a pid and its start
    time name one process, where a pid alone may have been reused."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": field 3 onwards; starttime is 22
    return int(fields[19]) if len(fields) > 19 and fields[0] not in ("Z", "X") else None


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


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def _process_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, process group, state) of every process, from /proc/<pid>/stat."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended while we looked
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2:
            table[int(entry.name)] = (int(fields[1]), int(fields[2]), fields[0])
    return table


def descendants(pid: int) -> list[int]:
    """Every living process below `pid` (children first): what a pause or a stop of a trainer must reach."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for child, (parent, _group, state) in table.items():
        if state not in ("Z", "X"):
            children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop(0)
        if child not in found:
            found.append(child)
            todo.extend(children.get(child, []))
    return found


def job_groups(pgid: int) -> set[int]:
    """The group `pgid` and every process group its members' descendants lead.

    torchrun starts each worker in a session of its own, so signalling the job's group reaches torchrun
    but not the trainers; a trainer stuck in a collective (its peer cut off) outlives a SIGKILLed torchrun."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _group, _state) in table.items():
        children.setdefault(parent, []).append(pid)
    groups, seen = {pgid}, set()
    todo = [pid for pid, (_parent, group, _state) in table.items() if group == pgid]
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in table:
            continue
        seen.add(pid)
        if table[pid][1] > 1:
            groups.add(table[pid][1])
        todo.extend(children.get(pid, []))
    return groups


def _wait_groups_gone(pgid: int, groups: set[int], timeout_s: float) -> bool:
    """Until no process of `groups` runs and the job's own group `pgid` is reaped. Zombies of the other
    groups do not count: an orphaned trainer is reparented to init, which may reap it late. Nor do
    zombies of `pgid` whose parent is this process: it reaps them itself once this returns (the
    wrapper stopping the child it started, a caller of stop_server), and waiting for that would only
    run out the grace and then the SIGKILL wait."""
    deadline = time.monotonic() + timeout_s
    while any(group in groups and state not in ("Z", "X") for _parent, group, state in _process_table().values()):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    me = os.getpid()
    while group_alive(pgid):  # the job's wrapper reaps its own
        if all(parent == me for parent, group, _state in _process_table().values() if group == pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True


def terminate_group(pgid: int, grace_s: float) -> str | None:
    """SIGTERM the group and the groups its descendants started, then SIGKILL what is left after
    `grace_s`; the signal that ended it."""
    if not group_alive(pgid):
        return None
    groups = job_groups(pgid)  # before any signal: once torchrun is gone, its workers are nobody's children
    for group in groups:
        _signal_group(group, signal.SIGTERM)
        _signal_group(group, signal.SIGCONT)  # a stopped process only acts on SIGTERM once continued
    if _wait_groups_gone(pgid, groups, grace_s):
        return "SIGTERM"
    groups |= job_groups(pgid) if group_alive(pgid) else set()  # started during the grace
    for group in groups:
        _signal_group(group, signal.SIGKILL)
    _wait_groups_gone(pgid, groups, 10)
    return "SIGKILL"
