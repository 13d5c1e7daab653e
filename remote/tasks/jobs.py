"""Tasks: `run` (any command as a job), `status`, `logs`, `stop`."""

from __future__ import annotations

import sys
import time

from invoke import task

from remote.errors import BadInput
from remote.session import emit_json, host_connection, host_session, reports_errors


def _command_after_double_dash() -> list[str]:
    """Invoke joins what follows `--` into one string, losing quoting; read the real argv instead."""
    argv = sys.argv
    return argv[argv.index("--") + 1:] if "--" in argv else []


@task(help={"host": "inventory host", "name": "job name (kind), e.g. extract", "run": "run the job belongs to",
            "detach": "return at once with the job id", "json": "one JSON document on stdout (implies --detach)"})
@reports_errors
def run(c, host=None, name="run", run=None, detach=False, json=False):
    """Launch any command as a job under tmux on the host: invoke run --host H -- CMD ARGS..."""
    from remote.launch import follow, launch

    command = _command_after_double_dash()
    if not command:
        raise BadInput("run: give the command after --, e.g. invoke run --host gpu1 -- nvidia-smi")
    with host_session(host) as session:  # one connection: launch, then follow
        chosen = session.host
        job = launch(session.conn, chosen, name, command, run=run)
        if json:
            emit_json({"ok": True, "job": job})
            return
        print(f"job {job['id']} started on {chosen.name}", file=sys.stderr)
        if detach:
            print(job["id"])
            return
        outcome = follow(session, job["id"], record=job)
    if not outcome.detached:
        print(f"job {job['id']}: {outcome.state} (exit code {outcome.exit_code})", file=sys.stderr)
        if outcome.state != "succeeded":
            raise SystemExit(1)


@task(help={"host": "inventory host", "json": "one JSON document on stdout", "all": "every job, not only the newest"})
@reports_errors
def status(c, host=None, json=False, all=False):
    """Jobs on the host with state, age, exit code and last log line; GPU use if it has GPUs."""
    from remote import render
    from remote.agent import agent_call
    from remote.jobs import job_call
    from remote.tasks.shared import render_epochs
    from specops.protocol import ACTIVE_STATES, JobState

    started = time.perf_counter()
    with host_connection(host) as (chosen, conn):
        document = job_call(conn, chosen, ["list", *(["--all"] if all else [])])
        train_jobs = [job for job in document["jobs"] if job["name"] in ("train", "pipeline") and job.get("run")]
        if train_jobs:
            # the newest training's per-epoch table: one more round trip, only when there is one
            newest = max(train_jobs, key=lambda job: job.get("created") or "")
            metrics = agent_call(conn, chosen, ["step", "metrics", "--run", newest["run"], "--no-plot"])
            if metrics.ok:
                document["metrics"] = metrics.document.get("epochs")
        trips = conn.round_trips
    document = {**document, "host": chosen.name, "round_trips": trips,
                "elapsed_s": round(time.perf_counter() - started, 3)}
    if json:
        emit_json(document)
        return
    out = render.console()
    view = render.table(f"jobs on {chosen.name}", ["job", "run", "state", "age", "exit", "last log line"])
    for job in document["jobs"]:
        state = job["state"]
        ok = None if state in ACTIVE_STATES else state == JobState.SUCCEEDED
        detail = (job.get("last_log_line") or "")[-100:]
        if job.get("note"):
            detail = f"{job['note'][:100]}\n{detail}"
        progress = job.get("progress")
        if progress and state in ACTIVE_STATES and progress.get("step") == "evaluate":
            detail = (f"evaluating {progress.get('draft')} ({progress.get('done')}/{progress.get('total')} drafts, "
                      f"{progress.get('prompts')} prompts, {progress.get('backend')})\n{detail}")
        elif progress and state in ACTIVE_STATES:
            detail = (f"{progress.get('done')}/{progress.get('total')} samples, "
                      f"{progress.get('tokens_per_s')} tokens/s, ETA {progress.get('eta_s')} s\n{detail}")
        view.add_row(job["id"], job.get("run") or "-", render.status_text(ok, state), _age(job.get("age_s")),
                     "-" if job.get("exit_code") is None else str(job["exit_code"]), detail)
    out.print(view)
    if document.get("metrics"):
        render_epochs(document["metrics"])
    for gpu in document.get("gpus") or []:
        out.print(f"GPU {gpu['index']} {gpu['name']}: {gpu['utilization_pct']}% util, "
                  f"{gpu['memory_used_mib']}/{gpu['memory_total_mib']} MiB")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


@task(help={"host": "inventory host", "job": "job id, or a name for the newest job of it (default: newest)",
            "follow": "stream until the job ends; Ctrl-C stops following only", "lines": "lines of tail to show"})
@reports_errors
def logs(c, host=None, job=None, follow_=False, lines=40):
    """Print the tail of a job's log (the newest job's by default); --follow streams it."""
    from remote.jobs import follow_log, job_call
    from remote.launch import follow

    with host_session(host) as session:  # one connection: find the job, then tail or follow it
        chosen = session.host
        job_id = job
        if job_id is None:
            jobs = job_call(session.conn, chosen, ["list", "--all"])["jobs"]
            if not jobs:
                raise BadInput(f"logs: no jobs on {chosen.name}")
            job_id = max(jobs, key=lambda item: item.get("created") or "")["id"]
        if not follow_:
            follow_log(chosen, job_id, None, lambda text: sys.stdout.write(text), lines=lines, follow=False,
                       session=session)
            return
        outcome = follow(session, job_id, lines=lines)
    if not outcome.detached:
        print(f"job {job_id}: {outcome.state} (exit code {outcome.exit_code})", file=sys.stderr)


@task(help={"host": "inventory host", "job": "job id or name (newest of that name)", "run": "run of a named job",
            "json": "one JSON document on stdout"})
@reports_errors
def stop(c, host=None, job=None, run=None, json=False):
    """End a job: its whole process group (SIGTERM, then SIGKILL), recorded as stopped."""
    from remote.jobs import job_call

    if not job:
        raise BadInput("stop: --job ID|NAME is required")
    with host_connection(host) as (chosen, conn):
        document = job_call(conn, chosen, ["stop", job, *(["--run", run] if run else [])])
    if json:
        emit_json(document)
        return
    record = document["job"]
    what = "had already ended" if document.get("already_ended") else f"stopped ({document.get('signal')})"
    print(f"job {record['id']} {what}; state {record['state']}")


TASKS = [run, status, logs, stop]
