"""Starting a job: take its run (a run's steps are exclusive, jobs.runlock) or refuse a second one of the
same name, write the record, start tmux."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import specops
from specops.contract.protocol import ACTIVE_STATES, JobRecord, JobState
from specops.host import atomic, gpus, paths
from specops.jobs import liveness, records, runlock, threads
from specops.jobs.tmux import TmuxServer

_START_WAIT_S = 5.0
_POLL_S = 0.05
# Variables that describe the launching agent's own terminal, not the job's.
_NOT_INHERITED = ("TMUX", "TMUX_PANE")


class AlreadyRunning(Exception):
    def __init__(self, record: JobRecord) -> None:
        super().__init__(record["id"])
        self.record = record


def running_job(name: str, run: str | None, server: TmuxServer) -> JobRecord | None:
    for record in reversed(records.all_records()):
        if record["name"] == name and record["run"] == run:
            if liveness.refresh(record, server)["state"] in ACTIVE_STATES:
                return record
    return None


def wrapper_argv(job_id: str) -> list[str]:
    """The wrapper, run by this very interpreter and this very copy of specops, in a clean env."""
    package_root = Path(specops.__file__).resolve().parent.parent
    env_program = shutil.which("env") or "/usr/bin/env"
    return [env_program, "-i", f"SPECOPS_WORKDIR={paths.workdir()}", f"PYTHONPATH={package_root}",
            sys.executable, "-m", "specops", "job", "wrap", job_id]


def is_cpu_job(env: dict[str, str]) -> bool:
    """No GPU for this job: the host has none, or the launch hides them."""
    hidden = env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES")) in ("", "-1")
    return hidden or gpus.host_kind() == "cpu"


def launch(*, name: str, run: str | None, argv: list[str], env: dict[str, str],
           revision: dict[str, Any] | None, meta: dict[str, Any] | None, wait: bool = False,
           within: str | None = None) -> JobRecord:
    """The new job's record. A job of a run holds the run until it ends (runlock.RunBusy names the
    holder when another has it), unless it works `within` that holder; with `wait` its wrapper takes
    the run once it is free. A job of no run (or a service of one) is refused while another of its
    name runs (AlreadyRunning)."""
    server = TmuxServer(paths.workdir())
    # Held until the session exists: a concurrent launch sees this job as running, and a
    # concurrent status check does not mistake the not-yet-started session for a lost job.
    with records.locked():
        job_id = records.new_job_id(name)
        while records.record_path(job_id).exists():
            job_id = records.new_job_id(name)
        holds = runlock.holds_run(name, run)
        works_within = False
        if holds and not wait:
            assert run is not None
            works_within = runlock.take_for_job(run, job_id, within)
        if not holds or works_within:
            duplicate = running_job(name, run, server)
            if duplicate is not None:
                raise AlreadyRunning(duplicate)
        log = records.logs_dir() / f"{job_id}.log"
        log.touch()
        record: JobRecord = {
            "id": job_id, "name": name, "run": run, "argv": argv, "env": env, "cwd": os.getcwd(),
            "created": records.now_iso(), "started": None, "ended": None, "state": JobState.PENDING,
            "exit_code": None, "signal": None, "pid": None, "pgid": None, "log": str(log),
            "tmux_session": job_id, "tmux_server": server.name, "revision": revision, "meta": meta or {},
        }
        if works_within and within is not None:
            record["within"] = within
        if holds and wait:  # the wrapper takes the run once it is free
            record["waits_for_run"] = True
        launch_env = {key: value for key, value in os.environ.items() if key not in _NOT_INHERITED}
        if is_cpu_job(env):
            record["threads"] = {**threads.usable_cores(), "env": threads.cpu_job_environment(env, launch_env)}
        atomic.write_text(records.environ_path(job_id), json.dumps(launch_env), mode=0o600)
        records.save(record)
        try:
            server.new_session(job_id, record["cwd"], wrapper_argv(job_id))
        except Exception as exc:
            failure = {"state": JobState.FAILED, "ended": records.now_iso(), "error": f"could not start tmux: {exc}"}
            records.update(job_id, lambda current: current.update(failure))
            raise
    return wait_while_pending(job_id, server, _START_WAIT_S)


def wait_while_pending(job_id: str, server: TmuxServer, timeout_s: float) -> JobRecord:
    """The record once the wrapper has taken over (or given up), or as it is after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    record = records.load(job_id)
    while (record["state"] == JobState.PENDING and not record.get("pgid") and not record.get("waiting_for")
           and time.monotonic() < deadline):
        time.sleep(_POLL_S)
        record = liveness.refresh(records.load(job_id), server)
    return record
