"""The contract both sides import: job states and records, the agent's exit codes, names that become paths.

Standard library only: remote/ (the workstation) imports this module too, and must never pull the
host's ML stack in with it.
"""

from __future__ import annotations

import re
from enum import IntEnum, StrEnum
from pathlib import PurePosixPath
from typing import Any, NamedTuple, NotRequired, TypedDict


class JobState(StrEnum):
    """A job's state in its record on the host (the record stores the plain string)."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"


# The variable a job's command finds its own job id in (set by the wrapper).
JOB_ID_VARIABLE = "SPECOPS_JOB_ID"
# Jobs that serve a run rather than step it: they take no hold on the run (a step of it uses them).
RUN_SERVICES: frozenset[str] = frozenset({"vllm-server", "vllm-keeper"})

ACTIVE_STATES: frozenset[str] = frozenset({JobState.PENDING, JobState.RUNNING})
TERMINAL_STATES: frozenset[str] = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED,
                                             JobState.LOST})


class JobRecord(TypedDict):
    """A job's record: state/jobs/<id>.json on the host, the host's truth about one job.

    Written by `job launch`, then by the wrapper tmux runs (pid, running, the exit), by `job stop`
    and by any reader that finds the job's tmux session gone (lost). Times are ISO 8601 in UTC with
    milliseconds; a field not known yet is null.
    """

    id: str                      # <name slug>-<UTC stamp>-<4 hex>; also the log's and the tmux session's name
    name: str                    # the kind of job: extract, train, vllm-server, ...; one active per name and run
    run: str | None              # the run it belongs to, if any
    argv: list[str]              # the command, as an argument list (never a shell string)
    env: dict[str, str]          # the job's own variables, on top of the launching agent's environment
    cwd: str                     # where the command runs (the launching agent's working directory)
    created: str                 # when `job launch` wrote the record
    started: str | None          # when the wrapper started the command
    ended: str | None            # when it exited, was stopped, or failed to start
    state: str                   # a JobState value
    exit_code: int | None        # the command's status; 128+N when signal N ended it; 126/127 could not start
    signal: str | None           # the name of the signal that ended it ("SIGTERM"), else null
    pid: int | None              # the command's pid; it leads its own session and process group
    pgid: int | None             # its process group: what `job stop` signals
    log: str                     # absolute path of the job's log (stdout and stderr, appended)
    tmux_session: str            # the tmux session running the wrapper (= id)
    tmux_server: str             # the tmux server (-L name) of this workdir
    revision: dict[str, Any] | None  # the synced agent's git revision ({"commit", "dirty", ...}), from `--revision`
    meta: dict[str, Any]         # free-form, from `--meta` (e.g. the doctor's verdict, skip_doctor)
    boot_id: NotRequired[str | None]   # the host's boot id when it started: a pid from an earlier boot is not it
    wrapper_pid: NotRequired[int]      # the wrapper's own pid
    stop_requested: NotRequired[str]   # when `job stop` asked: the exit then reads as stopped, not failed
    lost_at: NotRequired[str]          # when a reader found the session gone with no exit recorded
    threads: NotRequired[dict[str, Any]]  # a CPU host's cores for the job and the thread env it runs with
    error: NotRequired[str]            # why the job could not start (tmux, or the command itself)
    within: NotRequired[str]           # the job holding the run that this one works for (launched by it)
    waits_for_run: NotRequired[bool]   # launched with --wait: the wrapper takes the run once it is free
    waiting_for: NotRequired[str]      # while it waits: who holds the run


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


class Endpoint(NamedTuple):
    """HOST:PORT where nodes meet (an IPv6 host written in brackets); parsed once, from the command line."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """From HOST:PORT or [V6]:PORT, 0 < PORT < 65535 (a pipeline's training meets at PORT+1); ValueError."""
        host, _, port = str(text).rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65535:
            raise ValueError(f"expected HOST:PORT (PORT < 65535: the training meets at PORT+1), got {text!r}")
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def next_port(self) -> Endpoint:
        return Endpoint(self.host, self.port + 1)


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


# The trainer's stretch of a job log: the host writes these around `speculators train`'s raw output
# (which stays in the log as it is); the control side shows a progress bar per epoch there instead.
# The start line carries a JSON object: {"epochs": E, "first_epoch": e, "steps_per_epoch": S (an estimate)}.
TRAINER_START = "### specops trainer start "
TRAINER_END = "### specops trainer end"
# Between them, after each epoch: {"epoch": N, "mean_acceptance_length": x, "per_position_acceptance": [...],
# "prompts": P}, the draft's acceptance on a few held-out prompts (shown on that epoch's bar).
TRAINER_ACCEPTANCE = "### specops epoch acceptance "
# Online and hybrid training: the server's side beside the trainer's, now and then between the trainer's
# lines: {"served_per_s": .., "busy_share": .., "bytes": .., "budget_bytes": .., "job": ..}.
TRAINER_ONLINE = "### specops online "
# The trainer spends more than this share of a step waiting for data (speculators' profile/fetch_frac):
# the server is the slower side ("the trainer waits for the server"), else the server waits for it.
WAITS_FOR_DATA = 0.5
# One `key=value` of the trainer's step and validation records (train/loss=.., epoch=.., global_step=..).
TRAINER_METRIC = re.compile(
    r"(?<![\w/])((?:train|val|profile|lr)/[\w.]+|lr|epoch|global_step)=(-?(?:\d+\.?\d*(?:e[+-]?\d+)?|nan|inf))(?=[,\s]|$)")
