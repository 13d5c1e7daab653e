"""`invoke pipeline` on 1..K hosts: the workstation launches the engine, follows it and fetches; it is
never a step of the run.

    check + doctor   every host in parallel; one failing refuses the run before anything is launched
    attach           an engine of this run already running on the hosts: follow it (never stop it)
    launch           one `pipeline` job per host, all at once: with K > 1, node rank i of K meeting at
                     a rendezvous on the first host (specops.pipeline.hosts), the training at PORT+1
    follow           the first host's job (the engine's summary is its last line); --detach returns
                     its id at once
    fetch            from the host whose trainer saved the checkpoint

The engine on the hosts runs every step of the step table in order; steps whose inputs are unchanged
skip themselves on every host, so the same command after a finished run only checks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from remote.errors import AgentError, BadInput
from remote.several_hosts import each, first_failure
from remote.training_nodes import RDZV_PORT
from specops.contract import commandline
from specops.contract.progress import say

__all__ = ["RDZV_PORT", "attach_or_launch", "members", "pipeline_on_hosts"]

if TYPE_CHECKING:
    from remote.inventory import Host, Inventory
    from remote.session import HostSession
    from remote.ssh import Connection

Check = Callable[["Connection", "Host"], Any]  # run check + doctor of one host (from the task)
SERVE_PYTHON = {"SPECOPS_SERVE_PYTHON": "serve"}
JOB = "pipeline"


def run_hosts(run: str) -> tuple[str, list[str] | None]:
    """(the local run config's name as shown, its `hosts:` list or None); read here, where the
    inventory is, because the hosts must be known before any host is asked."""
    import yaml

    from remote.bundle import runs_dir

    path = runs_dir() / f"{run}.yaml"
    try:
        shown = path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        shown = str(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return shown, None  # the host's run check names what is wrong with it
    value = raw.get("hosts") if isinstance(raw, dict) else None
    if value is None:
        return shown, None
    if not isinstance(value, list) or not all(isinstance(name, str) and name for name in value):
        raise BadInput(f"{shown}: hosts: must be a list of inventory host names, got {value!r}")
    return shown, value


def members(inventory: Inventory, run: str, host_flag: str | None, hosts_flag: str | None) -> list[Host]:
    """The run's hosts: --hosts, else --host, else the run's `hosts:` list, else the default host."""
    from remote.several_hosts import chosen_hosts, distinct_names

    if hosts_flag:
        chosen = chosen_hosts(inventory, host_flag, hosts_flag, False) or []
        where = "--hosts"
    elif host_flag:
        return [inventory.host(host_flag)]
    else:
        where, names = run_hosts(run)
        if names is None:
            return [inventory.host(None)]
        where = f"{where}: hosts"
        distinct_names(names, where)
        unknown = [name for name in names if name not in inventory.hosts]
        if unknown:
            raise BadInput(f"{where}: {unknown[0]!r} is not a host of {inventory.path} "
                           f"(hosts: {', '.join(sorted(inventory.hosts))})")
        chosen = [inventory.hosts[name] for name in names]
    if len(chosen) < 2:
        raise BadInput(f"{where}: a pipeline across hosts needs at least two (got {len(chosen)}); "
                       "for one host use --host")
    return chosen


def running_engine(session: HostSession, run: str) -> dict[str, Any] | None:
    """This host's active pipeline job of `run`, if any."""
    from remote.jobs import job_call
    from specops.contract.protocol import ACTIVE_STATES

    listed = job_call(session.conn, session.host, commandline.job_list(all=True))["jobs"]
    active = [job for job in listed if job["name"] == JOB and job.get("run") == run and job["state"] in ACTIVE_STATES]
    return active[-1] if active else None


def engine_args(run: str, hosts: list[Host], rank: int, group: str, port: int, *, samples: int | None,
                backend: str | None, skip_patches: bool) -> list[str]:
    """Host `rank`'s engine: the pipeline alone on one host, node `rank` of K meeting on hosts[0] with more."""
    from remote.training_nodes import rendezvous_endpoint

    if len(hosts) == 1:
        return commandline.pipeline(run=run, samples=samples, backend=backend, skip_patches=skip_patches)
    host = hosts[rank]
    return commandline.pipeline(run=run, samples=samples, backend=backend, skip_patches=skip_patches,
                                hosts=[member.name for member in hosts], node_rank=rank,
                                rendezvous=rendezvous_endpoint(hosts[0], port), group=group,
                                local_addr=host.train_address, interface=host.train_interface)


def attach_or_launch(sessions: dict[str, HostSession], hosts: list[Host], run: str, check: Check, *,
                     samples: int | None, backend: str | None, skip_patches: bool,
                     port: int, wait: bool = False) -> tuple[dict[str, str], dict[str, Any] | None]:
    """({host: its engine job id}, {host: the doctor's verdict before the launch}; None: the engines were
    already running, and this attached to them). A launch on a host where another job of the run runs is
    refused (exit 2, naming it), unless `wait`: then the engine's job queues behind it."""
    from remote.launch import agent_step_command, launch
    from remote.names import safe_name

    running = each(sessions, lambda session: running_engine(session, run))
    first_failure(running, "listing jobs")
    found = {name: job for name, job in running.items() if job}
    if found:
        groups = {(job.get("meta") or {}).get("group") for job in found.values()}
        if len(found) == len(hosts) and len(groups) == 1:
            say(f"attaching to the pipeline of {run} already running: "
                + ", ".join(f"{name} job {job['id']}" for name, job in found.items()))
            return {name: job["id"] for name, job in found.items()}, None
        missing = [host.name for host in hosts if host.name not in found]
        where = ", ".join(f"{name} (job {job['id']})" for name, job in found.items())
        names = ",".join(host.name for host in hosts)
        raise AgentError(f"a pipeline of {run} is running on {where}"
                         f"{' but not on ' + ', '.join(missing) if missing else ' in another launch'}; let it end, "
                         f"or stop it (invoke stop --hosts {names} --job pipeline --run {run}) before launching "
                         "another")
    checked = each(sessions, lambda session: check(session.conn, session.host))
    first_failure(checked, "check", "; nothing was launched on any host" if len(hosts) > 1 else "")
    group = safe_name(f"{run}-{time.strftime('%Y%m%d-%H%M%S')}", "--run")
    ranks = {host.name: rank for rank, host in enumerate(hosts)}

    def start(session: HostSession) -> str:
        host = session.host
        args = engine_args(run, hosts, ranks[host.name], group, port, samples=samples, backend=backend,
                           skip_patches=skip_patches)
        env = {variable: host.envs[role] for variable, role in SERVE_PYTHON.items() if role in host.envs}
        meta = {"group": group, "hosts": [member.name for member in hosts],
                "doctor": checked[host.name].get("preflight")}
        return launch(session.conn, host, JOB, agent_step_command(host, args, "train"), run=run, meta=meta,
                      env=env, wait=wait)["id"]

    started = each(sessions, start)
    jobs = {name: value for name, value in started.items() if isinstance(value, str)}
    if len(jobs) < len(hosts):
        stop_jobs(sessions, jobs)
        first_failure(started, "launch", "; the other hosts' jobs were stopped")
    return jobs, {name: checked[name].get("preflight") for name in jobs}


def stop_jobs(sessions: dict[str, HostSession], jobs: dict[str, str]) -> None:
    from remote.jobs import job_call

    each({name: session for name, session in sessions.items() if name in jobs},
         lambda session: job_call(session.conn, session.host, commandline.job_stop(job=jobs[session.host.name],
                                                                                   grace=5)))


def pipeline_on_hosts(hosts: list[Host], inventory: Inventory, run: str, check: Check, *, samples: int | None,
                      backend: str | None, skip_patches: bool, no_fetch: bool, detach: bool,
                      port: int, wait: bool = False) -> tuple[dict[str, str], dict[str, Any] | None]:
    """Launch (or attach to) the run's engine on `hosts`; unless detached, follow the first host's job
    and fetch. ({host: job id}, the summary or None when detached)."""
    from remote.bundle import build_bundle
    from remote.fetch import fetch_run
    from remote.launch import follow
    from remote.session import HostSession
    from specops.contract.protocol import JobState

    started = time.perf_counter()
    build_bundle()  # once, before the threads: each would otherwise hash the checkout itself
    sessions = {host.name: HostSession(host, inventory) for host in hosts}
    try:
        jobs, doctor = attach_or_launch(sessions, hosts, run, check, samples=samples, backend=backend,
                                          skip_patches=skip_patches, port=port, wait=wait)
        first, attached = hosts[0].name, doctor is None
        say(f"job {jobs[first]} (pipeline, run {run}) {'running' if attached else 'started'} on {first}"
            + (f"; with {', '.join(f'{n} job {j}' for n, j in jobs.items() if n != first)}" if len(jobs) > 1 else ""))
        if detach:
            return jobs, None
        outcome = follow(sessions[first], jobs[first])
        if outcome.detached:
            raise SystemExit(0)
        result = outcome.last_document or {}
        if outcome.state != JobState.SUCCEEDED:
            raise AgentError(f"pipeline on {first}: job {jobs[first]} {outcome.state}: "
                             f"{result.get('error') or f'exit code {outcome.exit_code}'}")
        saver = sessions[result.get("saved_on") or first]
        fetched = None if no_fetch else fetch_run(saver.conn, saver.host, run)
    finally:
        for session in sessions.values():
            session.close()
    return jobs, {**result, "host": first, "hosts": [host.name for host in hosts], "jobs": jobs, "attached": attached,
                  "doctor": doctor,
            "fetched": fetched and fetched["destination"], "elapsed_s": round(time.perf_counter() - started, 1)}
