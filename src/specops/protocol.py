"""The contract both sides import: job states, the agent's exit codes, names that become paths.

Standard library only: remote/ (the workstation) imports this module too, and must never pull the
host's ML stack in with it.
"""

from __future__ import annotations

import re
from enum import IntEnum, StrEnum
from pathlib import PurePosixPath


class JobState(StrEnum):
    """A job's state in its record on the host (the record stores the plain string)."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"


ACTIVE_STATES: frozenset[str] = frozenset({JobState.PENDING, JobState.RUNNING})
TERMINAL_STATES: frozenset[str] = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED,
                                             JobState.LOST})


def is_active(state: str) -> bool:
    return state in ACTIVE_STATES


class AgentExit(IntEnum):
    """Exit statuses of `python -m specops ...` and of the shell prelude that starts it."""

    OK = 0
    CHECK_FAILED = 1
    BAD_INPUT = 2
    NO_WORKDIR = 3            # the prelude could not create or enter the workdir
    STALE_BUNDLE = 86         # the host's agent does not match the bundle hash: send it
    INSTALL_FAILED = 87       # unpacking the bundle on the host failed
    PYTHON_NOT_FOUND = 127    # the host's python (inventory `python`/`envs`) is missing


# One pattern for every name that becomes a file or folder name: hosts, runs, jobs, patch sets.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
SAFE_NAME_TEXT = "[A-Za-z0-9][A-Za-z0-9._-]*"


def name_problem(name: object) -> str | None:
    """Why `name` is not a safe name, or None when it is."""
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if not SAFE_NAME.fullmatch(name) or name in {".", ".."} or len(name) > 128:
        return f"{name!r} is not a safe name (letters, digits, '.', '_', '-'; matching {SAFE_NAME_TEXT})"
    return None


def stays_inside(relative: str | PurePosixPath) -> bool:
    """Whether a relative path, joined under any root, stays inside that root (decided lexically)."""
    path = PurePosixPath(relative)
    if path.is_absolute():
        return False
    depth = 0
    for part in path.parts:
        depth += -1 if part == ".." else 0 if part == "." else 1
        if depth < 0:
            return False
    return True
