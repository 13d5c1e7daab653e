"""Stopping a job: end its whole process group, record `stopped`, close its tmux session.

tmux kill-session alone only sends SIGHUP, which children that ignore it survive; the job's
command leads its own process group, so signalling the group reaches all of it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from specops.contract.protocol import ACTIVE_STATES, JobRecord, JobState
from specops.jobs import liveness, processes, records
from specops.jobs.launching import wait_while_pending
from specops.jobs.tmux import TmuxServer

_PENDING_WAIT_S = 5.0
_WRAPPER_RECORD_WAIT_S = 5.0
_POLL_S = 0.05


@dataclass
class StopOutcome:
    record: JobRecord
    already_ended: bool
    signal: str | None  # the signal that ended the process group, if it had to be signalled


def _request_stop(record: JobRecord) -> None:
    # The wrapper reads this when its child dies and records `stopped`, not `failed`.
    if record["state"] in ACTIVE_STATES or record["state"] == JobState.LOST:
        record.setdefault("stop_requested", records.now_iso())


def _mark_stopped(record: JobRecord) -> None:
    if record["state"] in ACTIVE_STATES or record["state"] == JobState.LOST:
        record["state"] = JobState.STOPPED
        record["ended"] = record.get("ended") or records.now_iso()


def _wait_for_wrapper(job_id: str) -> None:
    deadline = time.monotonic() + _WRAPPER_RECORD_WAIT_S
    while records.load(job_id)["state"] in ACTIVE_STATES and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def stop(record: JobRecord, grace_s: float, server: TmuxServer) -> StopOutcome:
    job_id = record["id"]
    record = liveness.refresh(wait_while_pending(job_id, server, _PENDING_WAIT_S), server)
    alive = liveness.processes_alive(record)
    if record["state"] not in ACTIVE_STATES and not (record["state"] == JobState.LOST and alive):
        return StopOutcome(record, already_ended=True, signal=None)
    record = records.update(job_id, _request_stop)
    used = processes.terminate_group(record["pgid"], grace_s) if alive and record.get("pgid") else None
    if record["state"] in ACTIVE_STATES:
        _wait_for_wrapper(job_id)
    server.kill_session(record["tmux_session"])
    return StopOutcome(records.update(job_id, _mark_stopped), already_ended=False, signal=used)
