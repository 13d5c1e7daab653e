"""A run's steps are exclusive on a host: at most one holder of run R at a time.

state/runs/<R>.json names the holder, beside the job table (the host's truth):
- a job, `{"job": ID}`: taken by `job launch --run R` as it starts the job (or by the job's wrapper,
  once the run is free, for a job launched with --wait);
- an agent process running a step directly, `{"pid", "started", "boot_id", "job", "what"}`.
Every look-and-take happens under the jobs lock (records.locked), so two launches or steps of
one run never both take it. Nothing releases a job's hold by hand: a holder is believed only while
it lives, a job while its record is active (refreshed against its tmux session) or its process
group runs, a process while its pid has the same start time in this boot. A job killed -9, a
rebooted host or a crashed agent leaves a file naming someone dead; the next taker overwrites it.

A job launched by the job that holds the run (`within`: the engine's driver starting a step's job)
works for that holder: its steps run, and the holder stays alive while such a job runs.
Services of a run (protocol.RUN_SERVICES: the run's vLLM server, which a step of the run uses)
take no hold; neither do read-only commands (status, logs, fetch-list, metrics, run show).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specops.contract.errors import BadInput
from specops.contract.protocol import ACTIVE_STATES, JOB_ID_VARIABLE, RUN_SERVICES, name_problem
from specops.host import atomic, paths
from specops.jobs import liveness, processes, records
from specops.jobs.tmux import TmuxServer

POLL_S = 0.5

Holder = dict[str, Any]


class RunBusy(BadInput):
    """Another job or process holds the run: one line naming it (exit 2)."""

    def __init__(self, run: str, holder: Holder) -> None:
        self.run, self.holder = run, holder
        super().__init__(f"run {run} is busy on this host: {describe(holder)} is running a step of it; "
                         "wait for it to end, stop it, or pass --wait to queue behind it")


def holds_run(name: str, run: str | None) -> bool:
    """Whether a job of this name takes the hold on its run (the run's services do not)."""
    return run is not None and name not in RUN_SERVICES


def lock_path(run: str) -> Path:
    problem = name_problem(run)
    if problem is not None:
        raise BadInput(f"--run: {problem}")
    return paths.state_dir("runs") / f"{run}.json"


def describe(holder: Holder) -> str:
    if "pid" in holder:
        inside = f" in job {holder['job']}" if holder.get("job") else ""
        return f"process {holder['pid']} ({holder.get('what') or 'an agent command'}){inside}"
    if holder.get("working"):  # the holder ended; a job it launched still works for it
        record = _record(holder["working"])
        name = f"{record['name']}, " if record else ""
        return f"job {holder['working']} ({name}working for job {holder['job']})"
    record = _record(holder["job"])
    return f"job {holder['job']}" + (f" ({record['name']})" if record else "")


def running_job(holder: Holder) -> str | None:
    """The id of the job that runs now for this holder, if a job does."""
    return holder.get("working") or holder.get("job")


def _record(job_id: str) -> dict[str, Any] | None:
    try:
        return dict(records.load(job_id))
    except BadInput:
        return None


def _job_alive(job_id: str, server: TmuxServer) -> bool:
    record = _record(job_id)
    if record is None:
        return False
    return liveness.refresh(record, server)["state"] in ACTIVE_STATES or liveness.processes_alive(record)


def _working_for(job_id: str, server: TmuxServer) -> str | None:
    """A job launched within `job_id` that still runs (the holder's work outlives its own process)."""
    return next((record["id"] for record in records.all_records()
                 if record.get("within") == job_id and record["state"] in ACTIVE_STATES
                 and _job_alive(record["id"], server)), None)


def _process_alive(holder: Holder) -> bool:
    if holder.get("boot_id") and holder["boot_id"] != processes.boot_id():
        return False  # a pid of an earlier boot names someone else, if anyone
    started = processes.start_ticks(holder["pid"])
    return started is not None and started == holder.get("started")  # the same process, not a reused pid


def live_holder(run: str) -> Holder | None:
    """The run's holder when it is alive; None when the run is free (no file, or its holder is dead)."""
    try:
        holder = json.loads(lock_path(run).read_text())
    except (OSError, ValueError):
        return None
    server = TmuxServer(paths.workdir())
    if "pid" in holder:
        return holder if _process_alive(holder) else None
    job_id = holder.get("job")
    if not job_id:
        return None
    if _job_alive(job_id, server):
        return holder
    working = _working_for(job_id, server)
    return {**holder, "working": working} if working else None


def _mine(holder: Holder, job_id: str | None) -> bool:
    """Whether this process may work under `holder`: it is the holder, or its job is (or works for) it."""
    if holder.get("pid") == os.getpid() and _process_alive(holder):
        return True
    if not job_id:
        return False
    held_by = holder.get("job")
    if held_by == job_id:
        return True
    record = _record(job_id)
    return bool(record and held_by and record.get("within") == held_by)


def take_for_job(run: str, job_id: str, within: str | None = None) -> bool:
    """At a launch, under records.locked(): the run for job `job_id`, or RunBusy naming its live holder.
    True when the job works `within` the live holder (which keeps the hold), False when it took it."""
    holder = live_holder(run)
    if holder is not None:
        if within is not None and holder.get("job") == within:
            return True
        raise RunBusy(run, holder)
    atomic.write_json(lock_path(run), {"job": job_id, "since": records.now_iso()})
    return False


def wait_for_job(run: str, job_id: str, stop_requested: Callable[[], bool],
                 on_wait: Callable[[Holder], None]) -> bool:
    """A job launched with --wait, in its wrapper: take the run once it is free. False when the job
    was stopped while it waited."""
    told = False
    while True:
        with records.locked():
            holder = live_holder(run)
            if holder is None or _mine(holder, job_id):
                if holder is None:
                    atomic.write_json(lock_path(run), {"job": job_id, "since": records.now_iso()})
                return True
        if stop_requested():
            return False
        if not told:
            on_wait(holder)
            told = True
        time.sleep(POLL_S)


def exclusive(handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """An agent command that runs a step of `args.run`: held exclusively (see `held`) while it runs,
    `args.wait` queueing behind the holder; `args.dry_run` only reads."""
    import functools
    import sys

    @functools.wraps(handler)
    def run_exclusively(args: Any) -> Any:
        if getattr(args, "dry_run", False):
            return handler(args)
        what = " ".join(str(part) for part in (args.command, getattr(args, "step", None) or
                                               getattr(args, "vllm_command", None)) if part)

        def waiting(holder: Holder) -> None:
            print(f"specops: run {args.run} is busy: waiting for {describe(holder)} to end", file=sys.stderr,
                  flush=True)

        with held(args.run, what, wait=args.wait, on_wait=waiting):
            return handler(args)

    return run_exclusively


@contextmanager
def held(run: str, what: str, *, wait: bool = False,
         on_wait: Callable[[Holder], None] | None = None) -> Iterator[None]:
    """Run a step of `run` in this process: proceed when the run is free (taking it until the step
    ends) or held by this process's own job; else RunBusy, or with `wait` wait for it to be free."""
    job_id = os.environ.get(JOB_ID_VARIABLE) or None
    told = False
    while True:
        with records.locked():
            holder = live_holder(run)
            if holder is not None and _mine(holder, job_id):
                taken = None
                break
            if holder is None:
                taken = {"pid": os.getpid(), "started": processes.start_ticks(os.getpid()),
                         "boot_id": processes.boot_id(), "job": job_id, "what": what, "since": records.now_iso()}
                atomic.write_json(lock_path(run), taken)
                break
        if not wait:
            raise RunBusy(run, holder)
        if not told and on_wait is not None:
            on_wait(holder)
            told = True
        time.sleep(POLL_S)
    try:
        yield
    finally:
        if taken is not None:
            with records.locked():
                try:
                    current = json.loads(lock_path(run).read_text())
                except (OSError, ValueError):
                    current = None
                if current == taken:
                    lock_path(run).unlink(missing_ok=True)
