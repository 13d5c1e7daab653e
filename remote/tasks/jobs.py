"""Tasks: `run` (any command as a job), `status`, `logs`, `stop`."""

from __future__ import annotations

import io
import sys

from invoke import task

from remote.errors import BadInput
from remote.session import emit_json, host_connection, host_session, reports_errors
from remote.tasks.shared import exchange_once
from specops.contract import commandline
from specops.contract.values import whole_flag


def _command_after_double_dash() -> list[str]:
    """Invoke joins what follows `--` into one string, losing quoting; read the real argv instead."""
    argv = sys.argv
    return argv[argv.index("--") + 1:] if "--" in argv else []


@task(help={"host": "inventory host", **commandline.JOB_LAUNCH.helps("name", "run"),
            "detach": "return at once with the job id", "json": "one JSON document on stdout (implies --detach)"})
@reports_errors
def run(c, host=None, name="run", run=None, detach=False, json=False):
    """Launch any command as a job under tmux on the host: invoke run --host H -- CMD ARGS..."""
    from remote.launch import follow, launch
    from remote.names import safe_name

    safe_name(name, "--name")  # a job's name and run become file names on the host: checked before connecting
    if run is not None:
        safe_name(run, "--run")
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
        outcome = follow(session, job["id"], record=job, stream=sys.stdout)  # log lines: stdout
    if not outcome.detached:
        print(f"job {job['id']}: {outcome.state} (exit code {outcome.exit_code})", file=sys.stderr)
        if outcome.state != "succeeded":
            raise SystemExit(1)


@task(help={"host": "inventory host", "json": "one JSON document on stdout", **commandline.JOB_LIST.helps("all"),
            "hosts": "several inventory hosts, comma-separated: in parallel, one row each",
            "all_hosts": "every inventory host, in parallel, one row each"})
@reports_errors
def status(c, host=None, json=False, all=False, hosts=None, all_hosts=False):
    """Jobs on the host with state, age, exit code and last log line; GPU use if it has GPUs."""
    from remote import render
    from remote.inventory import load_inventory
    from remote.several_hosts import chosen_hosts, run_across
    from remote.tasks.shared import render_epochs
    from specops.contract.protocol import ACTIVE_STATES, JobState

    inventory = load_inventory()
    several = chosen_hosts(inventory, host, hosts, all_hosts)

    def exchange(chosen, conn):
        return 0, status_document(conn, chosen, all)

    if several is not None:
        run_across("status", several, inventory, exchange, jobs_summary, json=json, totals=total_eta)
        return
    chosen, _code, document = exchange_once(inventory, host, exchange, quick=True)
    if json:
        emit_json(document)
        return
    out = render.console()
    view = render.table(f"jobs on {chosen.name}", ["job", "run", "state", "age", "exit", "last log line"])
    for job in document["jobs"]:
        state = job["state"]
        ok = None if state in ACTIVE_STATES else state == JobState.SUCCEEDED
        # an ended job's own result (a failure's reason) first, then the last line a person would read
        detail = "\n".join(dict.fromkeys(clip(text) for text in (job.get("result"), job.get("last_log_line")) if text))
        if job.get("note"):
            detail = f"{clip(job['note'])}\n{detail}"
        progress = job.get("progress")
        if progress and state in ACTIVE_STATES and progress.get("load"):
            detail = f"{load_line(progress)}\n{detail}"
        elif progress and state in ACTIVE_STATES and progress.get("step") == "evaluate":
            detail = (f"evaluating {progress.get('draft')} ({progress.get('done')}/{progress.get('total')} drafts, "
                      f"{progress.get('prompts')} prompts, {progress.get('backend')})\n{detail}")
        elif progress and state in ACTIVE_STATES and progress.get("online"):
            detail = f"{online_line(progress)}\n{detail}"
        elif progress and state in ACTIVE_STATES and progress.get("kept"):
            detail = f"{kept_line(progress)}\n{detail}"
        elif progress and state in ACTIVE_STATES:
            detail = (f"{progress.get('done')}/{progress.get('total')} samples, "
                      f"{progress.get('tokens_per_s')} tokens/s, ETA {progress.get('eta_s')} s\n{detail}")
        view.add_row(job["id"], job.get("run") or "-", render.status_text(ok, state), _age(job.get("age_s")),
                     _exit_text(job), detail)
    out.print(view)
    if document.get("metrics"):
        render_epochs(document["metrics"])
    for gpu in document.get("gpus") or []:
        out.print(f"GPU {gpu['index']} {gpu['name']}: {gpu['utilization_pct']}% util, "
                  f"{gpu['memory_used_mib']}/{gpu['memory_total_mib']} MiB")


def load_line(progress: dict) -> str:
    """A vLLM server still loading: its latest milestone (from vLLM's own log) and the time so far."""
    return f"loading the model, {progress.get('elapsed_s', 0):.0f} s: {progress['load']}"


def kept_line(progress: dict) -> str:
    """A vLLM server kept after its run (vllm.keep_server): for whom, and how long it stays up unused."""
    kept = progress["kept"]
    owner = f"kept by run {kept.get('owner_run')}"
    if kept.get("idle_s") is None:
        return f"{owner}, until stopped (vllm.keep_server: true)"
    if kept.get("idle_left_s") is None:
        return f"{owner}, stops after {_duration(kept['idle_s'])} unused"
    if kept.get("in_use"):
        return f"{owner}, in use (stops after {_duration(kept['idle_s'])} unused)"
    return f"{owner}, stops after {_duration(kept['idle_s'])} unused: {_duration(kept['idle_left_s'])} left"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def status_document(conn, host, all_jobs: bool) -> dict:
    """A host's jobs, and the newest training's per-epoch table when there is one (one more round trip)."""
    from remote.agent import agent_call
    from remote.jobs import job_call

    document = job_call(conn, host, commandline.job_list(all=all_jobs))
    train_jobs = [job for job in document["jobs"] if job["name"] in ("train", "pipeline") and job.get("run")]
    if train_jobs:
        newest = max(train_jobs, key=lambda job: job.get("created") or "")
        metrics = agent_call(conn, host, commandline.step_metrics(run=newest["run"], no_plot=True))
        if metrics.ok:
            document["metrics"] = metrics.document.get("epochs")
    return document


def jobs_summary(document: dict) -> str:
    """One line of a host's jobs: counts by state, then each active job with its progress and ETA."""
    from specops.contract.protocol import ACTIVE_STATES

    jobs = document.get("jobs") or []
    if not jobs:
        return "no jobs"
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job["state"]] = counts.get(job["state"], 0) + 1
    parts = [", ".join(f"{number} {state}" for state, number in sorted(counts.items()))]
    for job in jobs:
        if job["state"] not in ACTIVE_STATES:
            continue
        progress = job.get("progress") or {}
        detail = (f" {online_line(progress)}" if progress.get("online")
                  else f" {load_line(progress)}" if progress.get("load")
                  else f" {kept_line(progress)}" if progress.get("kept")
                  else f" {progress.get('done')}/{progress.get('total')}, ETA {progress.get('eta_s')} s"
                  if progress else "")
        parts.append(f"{job['id']} {job['state']}{detail}")
    return "; ".join(parts)


def total_eta(rows) -> dict:
    """The group's ETA: the slowest host's active job decides when the whole run's step is done."""
    from specops.contract.protocol import ACTIVE_STATES

    etas = [job["progress"]["eta_s"] for row in rows for job in row.document.get("jobs") or []
            if job["state"] in ACTIVE_STATES and (job.get("progress") or {}).get("eta_s") is not None]
    return {"total_eta_s": max(etas) if etas else None}


def _exit_text(job: dict) -> str:
    """The exit status and, when a signal ended the job, its name: "137 (SIGKILL)"."""
    code, signal = job.get("exit_code"), job.get("signal")
    if code is None:
        return signal or "-"
    return f"{code} ({signal})" if signal else str(code)


def clip(text: str, width: int = 100) -> str:
    """A line for a table cell: whole when it fits, else cut at a word (its start kept) with an ellipsis."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    cut = text[: width - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > width // 2 else cut).rstrip(" ,;:") + "…"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


@task(help={"host": "inventory host", "job": "job id, or a name for the newest job of it (default: newest)",
            "follow": "stream until the job ends; Ctrl-C stops following only", "lines": "lines of tail to show",
            "json": "one JSON document on stdout: the lines, the job's state and the log's byte offset"})
@reports_errors
def logs(c, host=None, job=None, follow_=False, lines=40, json=False):
    """Print the tail of a job's log (the newest job's by default); --follow streams it.

    The log's lines go to stdout (so `invoke logs --follow | grep x` works); specops' own notices to stderr.
    """
    from remote.jobs import follow_log, job_call
    from remote.launch import follow

    lines = whole_flag(lines, "--lines")
    collected: list[str] = []
    show = collected.append if json else lambda text: (sys.stdout.write(text), sys.stdout.flush())
    # one connection: find the job, then tail or follow it; a tail only reads (a shared master may carry it)
    with host_session(host, quick=not follow_) as session:
        chosen = session.host
        job_id = job
        if job_id is None:
            jobs = job_call(session.conn, chosen, commandline.job_list(all=True))["jobs"]
            if not jobs:
                raise BadInput(f"logs: no jobs on {chosen.name}")
            job_id = max(jobs, key=lambda item: item.get("created") or "")["id"]
        if follow_:
            sink = io.StringIO() if json else sys.stdout
            outcome = follow(session, job_id, lines=lines, stream=sink, raw=True)
            state, exit_code, detached = outcome.state, outcome.exit_code, outcome.detached
            text = sink.getvalue() if json else ""
        else:
            tailed = follow_log(chosen, job_id, None, show, lines=lines, follow=False, session=session)
            state, exit_code, detached, text = tailed.state, tailed.exit_code, False, "".join(collected)
            job_id = tailed.job_id
    if json:
        emit_json({"ok": True, "host": chosen.name, "job": job_id, "state": state, "exit_code": exit_code,
                   "lines": text.splitlines(), "followed": bool(follow_)})
        return
    if follow_ and not detached:
        print(f"job {job_id}: {state} (exit code {exit_code})", file=sys.stderr)


@task(help={"host": "inventory host",
            "job": "job id or name (newest of that name); default: every running job of the run",
            "run": "the run (default: the host's run)", "json": "one JSON document on stdout",
            "hosts": "stop the named job on several hosts at once (a training across hosts: --job train)",
            "all_hosts": "on every inventory host"})
@reports_errors
def stop(c, host=None, job=None, run=None, json=False, hosts=None, all_hosts=False):
    """End a job: its whole process group (SIGTERM, then SIGKILL), recorded as stopped.

    Without --job: the run, whole: its running step or pipeline first (it stops the vLLM server it started,
    unless the run keeps it), then the run's services still up (its vLLM server, a kept server's watch).
    """
    from remote.inventory import load_inventory
    from remote.jobs import job_call
    from remote.names import safe_name
    from remote.several_hosts import chosen_hosts, run_across

    if job is not None:
        safe_name(job, "--job")
    if run is not None:
        safe_name(run, "--run")
    inventory = load_inventory()
    several = chosen_hosts(inventory, host, hosts, all_hosts)
    if several is not None:
        if not job:
            raise BadInput(f"stop {'--all-hosts' if all_hosts else '--hosts'}: name the job with --job "
                           "(e.g. --job train)")
        args = commandline.job_stop(job=job, run=run)
        run_across(f"stop {job}", several, inventory, lambda chosen, conn: (0, job_call(conn, chosen, args)),
                   stopped_summary, json=json)
        return
    with host_connection(host) as (chosen, conn):
        if job is None:
            document = stop_run(conn, chosen, run or chosen.run)
        else:
            document = job_call(conn, chosen, commandline.job_stop(job=job, run=run))
    if json:
        emit_json(document)
        return
    print(stopped_summary(document))


def stop_run(conn: object, chosen: object, run_name: str) -> dict:
    """Every running job of the run stopped: the steps first (each stops, as it ends, the server it started
    unless the run keeps it; a server started for a step must not outlive the step's stop), then the run's
    services still running (protocol.RUN_SERVICES). One job: its document as `job stop` gives it; several:
    {"ok", "run", "stopped": [each job's document, in the order stopped]}."""
    from remote.jobs import job_call
    from specops.contract.protocol import ACTIVE_STATES, RUN_SERVICES

    def running() -> list[dict]:
        return [entry for entry in job_call(conn, chosen, commandline.job_list())["jobs"]
                if entry["state"] in ACTIVE_STATES and entry.get("run") == run_name]

    found = running()
    if not found:
        raise BadInput(f"stop: no job of run {run_name} is running on {chosen.name}; name one with --job")
    if len(found) == 1:
        return {**job_call(conn, chosen, commandline.job_stop(job=found[0]["id"])),
                "chosen": f"the one running job of run {run_name}"}
    steps = [entry for entry in found if entry["name"] not in RUN_SERVICES]
    stopped = [job_call(conn, chosen, commandline.job_stop(job=entry["id"])) for entry in steps]
    # after the steps: what is still up (a step stops its own server as it ends, unless the run keeps it);
    # the servers before their watch, whose job is to stop them
    services = sorted((entry for entry in found if entry["name"] in RUN_SERVICES),
                      key=lambda entry: entry["name"] != "vllm-server")
    stopped += [job_call(conn, chosen, commandline.job_stop(job=entry["id"])) for entry in services]
    return {"ok": True, "run": run_name, "stopped": stopped,
            "chosen": f"every running job of run {run_name}: its steps, then its services"}


def stopped_summary(document: dict) -> str:
    if "stopped" in document:  # a whole run: a line per job, in the order stopped
        if document.get("chosen"):
            print(f"stopping {document['chosen']}", file=sys.stderr)
        return "\n".join(f"{_stopped_line(entry)} ({entry['job'].get('name')})" for entry in document["stopped"])
    if document.get("chosen"):
        print(f"stopping {document['job']['id']}: {document['chosen']}", file=sys.stderr)
    return _stopped_line(document)


def _stopped_line(document: dict) -> str:
    record = document["job"]
    if document.get("already_ended"):
        # a server whose step stopped it as it ended (vllm.keep_server false), before its turn came here
        with_its_step = record["state"] == "stopped" and record.get("name") == "vllm-server"
        what = "was stopped by its run's step as the step ended" if with_its_step else "had already ended"
    else:
        what = f"stopped ({document.get('signal')})"
    return f"job {record['id']} {what}; state {record['state']}"


TASKS = [run, status, logs, stop]


def online_line(progress: dict) -> str:
    """Server and trainer side by side while a run trains online: who serves how fast, who waits."""
    server, trainer, disk = progress.get("server") or {}, progress.get("trainer") or {}, progress.get("disk") or {}
    budget = disk.get("budget_bytes")
    on_disk = f"{_mb(disk.get('bytes'))} on disk" + (f" of {_mb(budget)} budget" if budget else "")
    fetch, served = trainer.get("fetch_frac"), server.get("served_per_s")
    return (f"server {server.get('job') or '?'}: {'?' if served is None else served} hidden states/s | "
            f"trainer: {trainer.get('tokens_per_s') or '?'} tokens/s, "
            f"{'?' if fetch is None else f'{100 * fetch:.0f}%'} of each step waiting for data | "
            f"{progress.get('waits') or 'measuring'} | {on_disk}")


def _mb(value: object) -> str:
    return f"{value / 1e6:.1f} MB" if isinstance(value, (int, float)) else "?"
