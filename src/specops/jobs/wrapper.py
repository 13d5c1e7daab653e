"""The process tmux runs for a job (`python -m specops job wrap ID`).

It starts the job's command as the leader of a new session and process group, with its output
appended to the job's log and an environment built explicitly (the tmux server's own
environment is whatever its first client had), records pid/pgid and `running`, waits, and records
the exit. SIGHUP is deliberately not handled: if the tmux session is killed from outside, the
wrapper dies with it and the job reads as `lost`, never as a clean exit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable

from specops.contract.protocol import JOB_ID_VARIABLE, JobRecord, JobState
from specops.jobs import processes, records, runlock

# What a shell reports when it cannot find or cannot execute a command.
_NOT_FOUND = 127
_NOT_EXECUTABLE = 126


def child_environment(job_id: str, record: JobRecord) -> dict[str, str]:
    """The launching agent's environment, a CPU job's thread settings, then the record's explicit env;
    the copy on disk is then removed, as it may hold secrets and is needed only once."""
    path = records.environ_path(job_id)
    try:
        launch_env = json.loads(path.read_text())
    except FileNotFoundError:
        launch_env = dict(os.environ)
    path.unlink(missing_ok=True)
    return {**launch_env, **record.get("threads", {}).get("env", {}), **record["env"], JOB_ID_VARIABLE: job_id}


def _exit_fields(returncode: int) -> dict[str, object]:
    if returncode < 0:  # killed by a signal: report it as a shell would, and name the signal
        return {"exit_code": 128 - returncode, "signal": signal.Signals(-returncode).name}
    return {"exit_code": returncode, "signal": None}


def _finish(fields: dict[str, object]) -> Callable[[JobRecord], None]:
    def change(record: JobRecord) -> None:
        if record["state"] in (JobState.SUCCEEDED, JobState.FAILED):
            return
        record.update(fields)
        record["ended"] = record.get("ended") or records.now_iso()
        if record["state"] == JobState.STOPPED or record.get("stop_requested"):
            record["state"] = JobState.STOPPED
        else:
            record["state"] = JobState.SUCCEEDED if fields["exit_code"] == 0 else JobState.FAILED

    return change


def _queued(job_id: str, record: JobRecord) -> bool:
    """A job launched with --wait: take its run once it is free (the job's log says whom it waits for).
    False when it was stopped while waiting (then recorded stopped)."""
    run = record["run"]
    assert run is not None

    def waiting(holder: runlock.Holder) -> None:
        who = runlock.describe(holder)
        os.write(2, f"specops: run {run} is busy: waiting for {who} to end\n".encode())
        records.update(job_id, lambda current: current.update(waiting_for=who))

    taken = runlock.wait_for_job(run, job_id, lambda: bool(records.load(job_id).get("stop_requested")), waiting)
    if not taken:
        records.update(job_id, _finish({"exit_code": None, "signal": None}))
    return taken


def run_job(job_id: str) -> int:
    record = records.load(job_id)
    log_fd = os.open(record["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    # Our own errors (a traceback, say) belong in the job's log, not in a pane nobody sees.
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    if record.get("waits_for_run") and not _queued(job_id, record):
        os.close(log_fd)
        return 0
    try:
        child = subprocess.Popen(record["argv"], cwd=record["cwd"], env=child_environment(job_id, record),
                                 stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, start_new_session=True)
    except OSError as exc:
        code = _NOT_FOUND if isinstance(exc, FileNotFoundError) else _NOT_EXECUTABLE
        os.write(log_fd, f"specops: cannot start {record['argv'][0]!r}: {exc.strerror or exc}\n".encode())
        records.update(job_id, _finish({"exit_code": code, "signal": None, "error": str(exc)}))
        return code
    finally:
        os.close(log_fd)

    def mark_running(current: JobRecord) -> None:
        if current["state"] != JobState.PENDING:
            return
        current.update(pid=child.pid, pgid=child.pid, started=records.now_iso(),
                       boot_id=processes.boot_id(), wrapper_pid=os.getpid())
        if not current.get("stop_requested"):
            current["state"] = JobState.RUNNING

    current = records.update(job_id, mark_running)
    if current["state"] != JobState.RUNNING:  # stopped while we were starting: do not leave it behind
        processes.terminate_group(child.pid, 5)
    returncode = child.wait()
    records.update(job_id, _finish(_exit_fields(returncode)))
    return 0
