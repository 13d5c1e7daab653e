"""`invoke pipeline` on 1..K hosts, and `invoke train --hosts`: the workstation launches the engine,
follows it and fetches; it is never a step of the run.

    check + doctor   every host in parallel; one failing refuses the run before anything is launched
    attach           an engine of this run already running on the hosts: follow it (never stop it)
    launch           one `pipeline` job per host, all at once: with K > 1, node rank i of K meeting at
                     a rendezvous on the first host (specops.pipeline.hosts), the training at PORT+1
    follow           the first host's job (the engine's summary is its last line); --detach returns
                     its id at once
    fetch            from the host whose trainer saved the checkpoint

The engine on the hosts runs every step of the step table in order; steps whose inputs are unchanged
skip themselves on every host, so the same command after a finished run only checks. `invoke train
--hosts` is the same engine entered with the train step alone (`pipeline --only train`, job `train`):
the newest checkpoint any host holds reaches every host through the rendezvous, one torchrun node a
host trains, and a host that fails or goes silent stops the others' trainers (specops.pipeline.hosts).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from remote.errors import AgentError, BadInput
from remote.several_hosts import first_failure
from specops.contract import commandline
from specops.contract.progress import say
from specops.contract.protocol import Endpoint

__all__ = ["RDZV_PORT", "attach_or_launch", "members", "pipeline_on_hosts", "rendezvous_endpoint"]

if TYPE_CHECKING:
    from remote.inventory import Host, Inventory
    from remote.session import HostSession
    from remote.ssh import Connection

Check = Callable[["Connection", "Host", int], Any]  # run check + doctor of one host, by its rank (from the task)
JOB = "pipeline"
RDZV_PORT = 29400  # the rendezvous's port on the first host unless --port (the training meets at PORT+1)


def rendezvous_endpoint(host: Host, port: int) -> Endpoint:
    """HOST0:PORT as the other hosts reach it: the first host's training address, else the address its
    connection kind gives (the builders write it on the command line; the agent parses it back once)."""
    from remote.ssh import kind_of

    return Endpoint(host.train_address or kind_of(host).peer_address(host), port)


@dataclass(frozen=True)
class Alone:
    """The engine entered with one step of the table (`pipeline --only STEP`): `invoke train --hosts`."""

    step: str
    epochs: int | None = None
    fresh: bool = False


ROLES = ("serve", "train")


def roles_in(value: object, where: str) -> dict[str, list[str]] | None:
    """A run's hosts by role ({serve: [...], train: [...]}), from the run config's mapping or --hosts'
    `serve=a,b;train=c` (`;` or a space between roles); None for a plain list of hosts."""
    if isinstance(value, str):
        if "=" not in value:
            return None
        mapping: dict[str, object] = {}
        for part in value.replace(";", " ").split():
            role, _, names = part.partition("=")
            mapping[role] = [name for name in names.split(",") if name]
        value = mapping
    if not isinstance(value, dict):
        return None
    unknown = sorted(set(value) - set(ROLES))
    if unknown or any(role not in value for role in ROLES):
        raise BadInput(f"{where}: roles serve and train, each a list of inventory hosts (e.g. serve=gpu1,gpu2;"
                       f"train=gpu3), got {value!r}")
    roles = {role: value[role] for role in ROLES}
    for role, names in roles.items():
        if not isinstance(names, list) or not names or not all(isinstance(name, str) and name for name in names):
            raise BadInput(f"{where}: {role}: must be a list of inventory host names, got {names!r}")
    if len(roles["train"]) != 1:
        raise BadInput(f"{where}: train: one host (speculators 0.9 trains online on one host), "
                       f"got {roles['train']!r}")
    both = sorted(set(roles["serve"]) & set(roles["train"]))
    if both:
        raise BadInput(f"{where}: {both[0]} is both a serve and a train host; a host that does both is the one-host "
                       "online mode (--host)")
    return roles


def train_hosts(run: str, hosts_flag: str | None) -> list[str] | None:
    """The hosts that train in a role split (--hosts serve=..;train=.., else the run's hosts: mapping); None
    when every host does every step's share."""
    if hosts_flag:
        roles = roles_in(hosts_flag, "--hosts")
    else:
        where, value = run_config_hosts(run)
        roles = roles_in(value, f"{where}: hosts")
    return roles["train"] if roles else None


def run_config_hosts(run: str) -> tuple[str, object]:
    """(the local run config's name as shown, its raw `hosts:` value or None)."""
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
    return shown, raw.get("hosts") if isinstance(raw, dict) else None


def run_hosts(run: str) -> tuple[str, list[str] | None]:
    """(the local run config's name as shown, its `hosts:` list or None; by role: serve hosts, then the train
    host); read here, where the inventory is, because the hosts must be known before any host is asked."""
    shown, value = run_config_hosts(run)
    if value is None:
        return shown, None
    roles = roles_in(value, f"{shown}: hosts")
    if roles:
        return shown, [*roles["serve"], *roles["train"]]
    if not isinstance(value, list) or not all(isinstance(name, str) and name for name in value):
        raise BadInput(f"{shown}: hosts: must be a list of inventory host names, got {value!r}")
    return shown, value


def members(inventory: Inventory, run: str, host_flag: str | None, hosts_flag: str | None) -> list[Host]:
    """The run's hosts: --hosts, else --host, else the run's `hosts:` list, else the default host."""
    from remote.several_hosts import chosen_hosts, distinct_names

    roles = roles_in(hosts_flag, "--hosts") if hosts_flag else None
    if roles:  # by role: the serve hosts (the first hosts the rendezvous), then the train host
        hosts_flag = ",".join([*roles["serve"], *roles["train"]])
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


def job_name(alone: Alone | None) -> str:
    return alone.step if alone else JOB


def running_engine(conn: Connection, host: Host, run: str, name: str = JOB) -> dict[str, Any] | None:
    """This host's active engine job `name` (pipeline, or train for `train --hosts`) of `run`, if any."""
    from remote.jobs import job_call
    from specops.contract.protocol import ACTIVE_STATES

    listed = job_call(conn, host, commandline.job_list(all=True))["jobs"]
    active = [job for job in listed if job["name"] == name and job.get("run") == run and job["state"] in ACTIVE_STATES]
    return active[-1] if active else None


def engine_args(run: str, hosts: list[Host], rank: int, group: str, port: int, *, samples: int | None,
                backend: str | None, skip_patches: bool, alone: Alone | None = None,
                train: list[str] | None = None) -> list[str]:
    """Host `rank`'s engine: the pipeline alone on one host, node `rank` of K meeting on hosts[0] with more."""
    steps = {"only": alone.step, "epochs": alone.epochs, "fresh": alone.fresh} if alone else {}
    if len(hosts) == 1:
        return commandline.pipeline(run=run, samples=samples, backend=backend, skip_patches=skip_patches, **steps)
    host = hosts[rank]
    return commandline.pipeline(run=run, samples=samples, backend=backend, skip_patches=skip_patches,
                                hosts=[member.name for member in hosts], node_rank=rank,
                                rendezvous=rendezvous_endpoint(hosts[0], port), group=group,
                                local_addr=host.train_address, interface=host.train_interface,
                                train_hosts=train or None, **steps)


def check_training_network(sessions: dict[str, HostSession], hosts: list[Host], inventory_path: object, run: str,
                           port: int) -> None:
    """Every host whose inventory names a training network holds it, before any node starts: a dry run of
    its training node on the host; bad input names the inventory file, the host and the key."""
    from remote.agent import agent_call
    from remote.ssh import fan_out

    endpoint = rendezvous_endpoint(hosts[0], port)
    keys = {"--local-addr": "train_address", "--interface": "train_interface"}

    def check(host: Host, conn: Connection) -> tuple[int, str] | None:
        if not (host.train_address or host.train_interface):
            return None  # nothing to check: torch's own choice
        args = commandline.step_train(run=run, nnodes=len(hosts), node_rank=0, rdzv_endpoint=endpoint,
                                      rdzv_id="check", local_addr=host.train_address or None,
                                      interface=host.train_interface or None, dry_run=True)
        result = agent_call(conn, host, args)
        return None if result.ok else (result.exit_code, str(result.document.get("error")))

    outcomes = fan_out(hosts, check, sessions=sessions)
    for name, outcome in outcomes.items():  # the training network's problems first, in inventory terms
        value = outcome.value
        if isinstance(value, tuple) and (flag := value[1].partition(": ")[0]) in keys:
            raise BadInput(f"{inventory_path}: hosts.{name}.{keys[flag]}: {value[1].partition(': ')[2]}")
    first_failure(outcomes, "checking the training network", "; nothing was launched on any host")
    for name, outcome in outcomes.items():
        if outcome.value is not None:
            raise (BadInput if outcome.value[0] == 2 else AgentError)(f"{name}: {outcome.value[1]}")


def attach_or_launch(sessions: dict[str, HostSession], hosts: list[Host], run: str, check: Check, *,
                     samples: int | None, backend: str | None, skip_patches: bool,
                     port: int, wait: bool = False, alone: Alone | None = None,
                     inventory_path: object = None,
                     train: list[str] | None = None) -> tuple[dict[str, str], dict[str, Any] | None]:
    """({host: its engine job id}, {host: the doctor's verdict before the launch}; None: the engines were
    already running, and this attached to them). A launch on a host where another job of the run runs is
    refused (exit 2, naming it), unless `wait`: then the engine's job queues behind it."""
    from remote.launch import agent_step_command, launch
    from remote.names import safe_name
    from remote.ssh import fan_out

    name = job_name(alone)
    running = fan_out(hosts, lambda host, conn: running_engine(conn, host, run, name), sessions=sessions)
    first_failure(running, "listing jobs")
    found = {host: outcome.value for host, outcome in running.items() if outcome.value}
    if found:
        groups = {(job.get("meta") or {}).get("group") for job in found.values()}
        if len(found) == len(hosts) and len(groups) == 1:
            say(f"attaching to the pipeline of {run} already running: "
                + ", ".join(f"{name} job {job['id']}" for name, job in found.items()))
            return {name: job["id"] for name, job in found.items()}, None
        missing = [host.name for host in hosts if host.name not in found]
        where = ", ".join(f"{name} (job {job['id']})" for name, job in found.items())
        names = ",".join(host.name for host in hosts)
        what = "a pipeline" if alone is None else f"a {name} across hosts"
        raise AgentError(f"{what} of {run} is running on {where}"
                         f"{' but not on ' + ', '.join(missing) if missing else ' in another launch'}; let it end, "
                         f"or stop it (invoke stop --hosts {names} --job {name} --run {run}) before launching "
                         "another")
    ranks = {host.name: rank for rank, host in enumerate(hosts)}
    checked = fan_out(hosts, lambda host, conn: check(conn, host, ranks[host.name]), sessions=sessions)
    first_failure(checked, "check", "; nothing was launched on any host" if len(hosts) > 1 else "")
    if len(hosts) > 1:
        check_training_network(sessions, hosts, inventory_path, run, port)
    group = safe_name(f"{run}-{time.strftime('%Y%m%d-%H%M%S')}", "--run")
    preflights = {host: (outcome.value or {}).get("preflight") for host, outcome in checked.items()}

    def start(host: Host, conn: Connection) -> str:
        args = engine_args(run, hosts, ranks[host.name], group, port, samples=samples, backend=backend,
                           skip_patches=skip_patches, alone=alone, train=train)
        env = host.job_env()
        meta = {"group": group, "hosts": [member.name for member in hosts], "doctor": preflights[host.name]}
        return launch(conn, host, name, agent_step_command(host, args, "train"), run=run, meta=meta,
                      env=env, wait=wait)["id"]

    started = fan_out(hosts, start, sessions=sessions)
    jobs = {host: outcome.value for host, outcome in started.items() if outcome.ok and outcome.value}
    if len(jobs) < len(hosts):
        stop_jobs(sessions, hosts, jobs)
        first_failure(started, "launch", "; the other hosts' jobs were stopped")
    return jobs, {host: preflights[host] for host in jobs}


def stop_jobs(sessions: dict[str, HostSession], hosts: list[Host], jobs: dict[str, str]) -> None:
    from remote.jobs import job_call
    from remote.ssh import fan_out

    fan_out([host for host in hosts if host.name in jobs],
            lambda host, conn: job_call(conn, host, commandline.job_stop(job=jobs[host.name], grace=5)),
            sessions=sessions)


def pipeline_on_hosts(hosts: list[Host], inventory: Inventory, run: str, check: Check, *, samples: int | None,
                      backend: str | None, skip_patches: bool, no_fetch: bool, detach: bool,
                      port: int, wait: bool = False, alone: Alone | None = None,
                      train: list[str] | None = None) -> tuple[dict[str, str], dict[str, Any] | None]:
    """Launch (or attach to) the run's engine on `hosts` (`alone`: entered with that one step); unless
    detached, follow the first host's job and fetch. ({host: job id}, the summary or None when detached)."""
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
                                        skip_patches=skip_patches, port=port, wait=wait, alone=alone,
                                        inventory_path=inventory.path, train=train)
        first, attached, name = hosts[0].name, doctor is None, job_name(alone)
        say(f"job {jobs[first]} ({name}, run {run}) {'running' if attached else 'started'} on {first}"
            + (f"; with {', '.join(f'{n} job {j}' for n, j in jobs.items() if n != first)}" if len(jobs) > 1 else ""))
        if detach:
            return jobs, None
        outcome = follow(sessions[first], jobs[first])
        if outcome.detached:
            raise SystemExit(0)
        result = outcome.last_document or {}
        if outcome.state != JobState.SUCCEEDED:
            where = (f"{name} on {first}: job {jobs[first]}" if alone is None
                     else f"{name} across {', '.join(jobs)}: job {jobs[first]} on {first}")
            raise AgentError(f"{where} {outcome.state}: {result.get('error') or f'exit code {outcome.exit_code}'}")
        saver = sessions[result.get("saved_on") or first]
        fetched = None if no_fetch else fetch_run(saver.conn, saver.host, run)
    finally:
        for session in sessions.values():
            session.close()
    return jobs, {**result, "host": first, "hosts": [host.name for host in hosts], "jobs": jobs, "attached": attached,
                  "doctor": doctor,
            "fetched": fetched and fetched["destination"], "elapsed_s": round(time.perf_counter() - started, 1)}
