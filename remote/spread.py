"""The whole pipeline over several hosts (`invoke pipeline --hosts a,b`, or the run's `hosts:`).

    check + doctor     every host in parallel; one failing refuses the run before anything is launched
    patches            host by host (cheap; hosts sharing one package folder, an NFS home, never race)
    regenerate --part  one job per host (when the run regenerates): each answers its share of the
                       conversations (whole one-host batches, in source order; regenerate.shares)
    gather answers     the shares joined in order onto every host (remote.answers), then
    regenerate --require-whole   every host: answers for every conversation or exit 1; it records
                       regenerate done with the one-host inputs hash, so prepare finds it current
    extract --part     one job per host, launched together and watched together (remote.group.Group):
                       each prepares the same N rows (from the same answers), then writes
                       share I of the one-host batch plan, so every file is the bytes one host writes
    gather             every share onto every host that lacks rows (remote.gather: tar over the
                       verified connections, renamed in)
    extract --require-whole   every host: all N files whole (header and size) or exit 1 naming the
                       host and the file; nothing trains before
    validate           fidelity to the target, on the first host
    vocab              every host
    train              remote.group.Group: one torchrun node per host, c10d rendezvous at the first
    evaluate, fetch    on the host where the trainer saved (c10d's global rank 0: its epoch links);
                       every host gets the newest checkpoint too

The first job that fails, or the first host that goes silent, stops the other hosts' jobs and the
task exits 1 naming that host. Steps whose inputs are unchanged skip themselves on each host.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from remote.errors import AgentError, BadInput, SpecopsError
from specops import commandline

if TYPE_CHECKING:
    from remote.group import Group
    from remote.inventory import Host, Inventory
    from remote.session import HostSession
    from remote.ssh import Connection

Check = Callable[["Connection", "Host"], Any]  # check_run + preflight of one host (from the task): its
# document ("regenerates": whether the run has a regenerate step)
SERVE_PYTHON = {"SPECOPS_SERVE_PYTHON": "serve"}


def say(message: str) -> None:
    print(f"specops: {message}", file=sys.stderr, flush=True)


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


def members(inventory: Inventory, run: str, host_flag: str | None, hosts_flag: str | None) -> list[Host] | None:
    """The hosts of a pipeline across hosts (--hosts wins over the run's list); None: one host (also
    when --host names one)."""
    from remote.fleet import chosen_hosts

    if hosts_flag:
        chosen = chosen_hosts(inventory, host_flag, hosts_flag, False) or []
        where = "--hosts"
    elif host_flag:
        return None
    else:
        where, names = run_hosts(run)
        if names is None:
            return None
        where = f"{where}: hosts"
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise BadInput(f"{where}: {duplicates[0]!r} is named twice")
        unknown = [name for name in names if name not in inventory.hosts]
        if unknown:
            raise BadInput(f"{where}: {unknown[0]!r} is not a host of {inventory.path} "
                           f"(hosts: {', '.join(sorted(inventory.hosts))})")
        chosen = [inventory.hosts[name] for name in names]
    if len(chosen) < 2:
        raise BadInput(f"{where}: a pipeline across hosts needs at least two (got {len(chosen)}); "
                       "for one host use --host")
    return chosen


def first_failure(results: dict[str, Any], what: str, after: str = "") -> None:
    """Raise the first host's error of a parallel exchange, naming the host (bad input wins: exit 2)."""
    failed = {name: value for name, value in results.items() if isinstance(value, Exception)}
    if not failed:
        return
    name, error = next(((n, e) for n, e in failed.items() if isinstance(e, BadInput)), next(iter(failed.items())))
    if isinstance(error, BadInput):
        raise BadInput(str(error))
    raise AgentError(f"{what} on {name}: {error}{after}")


def job_result(session: HostSession, job_id: str) -> dict[str, Any]:
    """A finished job's own JSON result (the last line of its log)."""
    from remote.launch import follow

    return follow(session, job_id, quiet=True, lines=200).last_document or {}


def run_everywhere(group: Group, name: str, args: Callable[[int, Host], list[str]], run: str, *,
                   env_role: str | None = None) -> dict[str, dict[str, Any]]:
    """Job `name` on every host at once, watched together; each host's JSON result. The first failing
    (or silent) host stops the others, and the error names it and what its job reported."""
    from remote.launch import agent_step_command, launch

    ranks = {host.name: rank for rank, host in enumerate(group.hosts)}

    def start(session: HostSession) -> str:
        host = session.host
        env = {variable: host.envs[role] for variable, role in SERVE_PYTHON.items() if role in host.envs}
        command = agent_step_command(host, args(ranks[host.name], host), env_role)
        return launch(session.conn, host, name, command, run=run, env=env)["id"]

    started = group.each(start)
    group.jobs = {host: value for host, value in started.items() if isinstance(value, str)}
    if len(group.jobs) < len(group.hosts):
        group.stop_all()
        first_failure(started, f"{name} launch", "; the other hosts' jobs were stopped")
    say(f"{name} across {', '.join(group.sessions)}: jobs {', '.join(group.jobs.values())}")
    outcome = group.watch(what=name)
    if not outcome.ok:
        host = str(outcome.failed_host)
        reported = ""
        if outcome.states.get(host) is not None:  # the host answers: what its job said
            try:
                reported = str(job_result(group.sessions[host], group.jobs[host]).get("error") or "")
            except SpecopsError:
                reported = ""
        raise AgentError(f"{name} across {', '.join(group.sessions)}: {host}: {outcome.why}"
                         f"{': ' + reported if reported else ''}; stopped the others "
                         f"({', '.join(outcome.stopped) or 'nothing else was running'})")
    results = group.each(lambda session: job_result(session, group.jobs[session.host.name]))
    first_failure(results, f"{name} result")
    return results


def run_on(session: HostSession, name: str, args: list[str], run: str, env_role: str | None = None) -> dict[str, Any]:
    """One job on one host, its log followed to stderr; its JSON result."""
    from remote.launch import agent_step_command, follow, launch
    from specops.protocol import JobState

    host = session.host
    env = {variable: host.envs[role] for variable, role in SERVE_PYTHON.items() if role in host.envs}
    job = launch(session.conn, host, name, agent_step_command(host, args, env_role), run=run, env=env)
    say(f"{name} on {host.name}: job {job['id']}")
    outcome = follow(session, job["id"], record=job)
    result = outcome.last_document or {}
    if outcome.state != JobState.SUCCEEDED:
        raise AgentError(f"{name} on {host.name}: job {job['id']} {outcome.state}: "
                         f"{result.get('error') or f'exit code {outcome.exit_code}'}")
    return result


def same_extraction(parts: dict[str, dict[str, Any]]) -> None:
    """Every host must have planned the same extraction (inputs, N): else the shares do not fit."""
    plans = {name: (report["part"]["inputs_hash"], report["part"]["samples"]) for name, report in parts.items()}
    if len(set(plans.values())) > 1:
        shown = ", ".join(f"{name}: {digest[:12]} of {count} rows" for name, (digest, count) in plans.items())
        raise AgentError(f"extract across hosts: the hosts planned different extractions ({shown}); their "
                         "target, data, dtype or device differ, so their shares would not fit together")


def pipeline_across(hosts: list[Host], inventory: Inventory, run: str, check: Check, *, samples: int | None,
                    skip_patches: bool, no_fetch: bool, port: int) -> dict[str, Any]:
    """The whole pipeline over `hosts`; the summary document (raises on the first failure)."""
    from remote.agent import agent_call
    from remote.bundle import build_bundle
    from remote.fetch import fetch_run
    from remote.gather import gather
    from remote.group import Group

    started_all = time.perf_counter()
    steps: dict[str, dict[str, Any]] = {}

    def timed(name: str, action: Callable[[], Any]) -> Any:
        say(f"== {name}")
        started = time.perf_counter()
        value = action()
        steps[name] = {"status": "done", "seconds": round(time.perf_counter() - started, 2)}
        return value

    build_bundle()  # once, before the threads: each would otherwise hash the checkout itself
    with Group(hosts, inventory) as group:
        first = group.sessions[hosts[0].name]
        def check_everywhere() -> dict[str, Any]:
            results = group.each(lambda s: check(s.conn, s.host))
            first_failure(results, "check", "; nothing was launched on any host")
            return results

        checked = timed("check", check_everywhere)
        regenerates = any(document.get("regenerates", True) for document in checked.values())

        def patches() -> None:
            for session in group.sessions.values():
                for action in ("apply", "verify"):
                    result = agent_call(session.conn, session.host, commandline.patch(action=action), timeout=300)
                    if not result.ok:
                        raise AgentError(f"patch {action} on {session.host.name}: "
                                         f"{result.document.get('error') or 'a check failed'}")

        if skip_patches:
            steps["patches"] = {"status": "skipped: --skip-patches"}
        else:
            timed("patches", patches)
        count = len(hosts)
        if regenerates:
            answers = regenerate_across(group, run, timed, steps)
        else:  # no regenerate job on any host: each would only report that it has nothing to do
            answers = None
            steps["regenerate"] = {"status": "skipped: the run does not regenerate"}
        parts = timed("extract", lambda: run_everywhere(
            group, "extract", lambda rank, _host: commandline.step_extract(run=run, samples=samples,
                                                                          part=(rank, count)), run))
        same_extraction(parts)
        gathered = timed("gather", lambda: gather(group, parts))
        timed("verify", lambda: run_everywhere(
            group, "extract", lambda _rank, _host: commandline.step_extract(run=run, samples=samples,
                                                                           require_whole=True), run))
        validated = timed("validate", lambda: run_on(first, "validate", commandline.step_validate(run=run), run))
        timed("vocab", lambda: run_everywhere(group, "vocab", lambda _r, _h: commandline.step_vocab(run=run), run))
        trained = timed("train", lambda: train_group(group, run, port))
        holder = group.sessions[trained["saved_on"]]
        evaluated = timed("evaluate", lambda: run_on(holder, "evaluate", commandline.step_evaluate(run=run), run,
                                                     env_role="train"))
        fetched = None if no_fetch else fetch_run(holder.conn, holder.host, run)
    return {"ok": True, "run": run, "hosts": [host.name for host in hosts], "steps": steps, "regenerate": answers,
            "extract": {name: {"rows": report["part"]["rows"], "spans": report["part"]["spans"],
                               "written": report["counts"].get("written", 0), "status": report["status"]}
                        for name, report in parts.items()},
            "samples": next(iter(parts.values()))["part"]["samples"], "gathered": gathered,
            "fidelity": ((validated.get("checks") or {}).get("fidelity") or {}).get("detail", {}).get("agreement"),
            "train": trained, "evaluated_on": holder.host.name, "evaluation": {
                key: evaluated.get(key) for key in ("report", "untrained", "previous", "plot", "best")},
            "fetched": fetched and fetched["destination"], "elapsed_s": round(time.perf_counter() - started_all, 1)}


def regenerate_across(group: Group, run: str, timed: Callable[[str, Callable[[], Any]], Any],
                      steps: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Each host answers its share of the conversations; the shares are joined onto every host, and
    every host checks them whole and records regenerate done (prepare then finds it current). None
    when the run does not regenerate."""
    from remote.answers import gather_answers, regenerating

    count = len(group.hosts)
    parts = timed("regenerate", lambda: run_everywhere(
        group, "regenerate", lambda rank, _host: commandline.step_regenerate(run=run, part=(rank, count)), run))
    if not regenerating(parts):
        steps["regenerate"]["status"] = "skipped: the run does not regenerate"
        return None
    shares = {name: {"status": report["status"], "rows": report["part"]["rows"],
                     "answers": report["counts"].get("rows")} for name, report in parts.items()}
    if all(report["status"] == "skipped: unchanged" for report in parts.values()):
        return {"shares": shares, "gathered": None}  # every host already holds the whole answers
    gathered = timed("gather answers", lambda: gather_answers(group, parts))
    timed("verify answers", lambda: run_everywhere(
        group, "regenerate", lambda _rank, _host: commandline.step_regenerate(run=run, require_whole=True), run))
    return {"shares": shares, "gathered": gathered}


def train_group(group: Group, run: str, port: int) -> dict[str, Any]:
    """One training across the group's hosts; then every host gets the newest checkpoint."""
    group.check_training_network(run, port)
    group.stop_stale(run)
    before = group.sync_checkpoints(run)
    rdzv_id = group.launch(run, port, epochs=None, fresh=False)
    say(f"training {run} across {', '.join(group.sessions)} (group {rdzv_id})")
    outcome = group.watch()
    if not outcome.ok:
        raise AgentError(f"train across {', '.join(group.sessions)}: {outcome.failed_host}: {outcome.why}; "
                         f"stopped the group ({', '.join(outcome.stopped) or 'nothing else was running'})")
    holder = saver(group, run)
    after = group.sync_checkpoints(run)
    return {"group": rdzv_id, "synced_before": before, "epoch": after["epoch"], "saved_on": holder,
            "copied_to": after["copied_to"], "states": outcome.states}


def saver(group: Group, run: str) -> str:
    """The host where the trainer saved (c10d's global rank 0): the one with the finished-epoch links
    (`epochN_end`) that fetch and evaluate go by; a copied checkpoint has none, and its config names
    the saver's own target path."""
    from remote.agent import agent_call

    def links(session: HostSession) -> int:
        result = agent_call(session.conn, session.host, commandline.step_metrics(run=run, no_plot=True))
        if not result.ok:
            raise AgentError(str(result.document.get("error")))
        folder = result.document["checkpoints"]["folder"]
        found = session.conn.run(["find", folder, "-maxdepth", "1", "-type", "l", "-name", "epoch*_end"])
        return len(found.stdout.split()) if found.exit_code == 0 else 0

    counts = group.each(links)
    first_failure(counts, "finding the saved checkpoint")
    most = max(counts.values())
    if not most:
        raise AgentError(f"train across {', '.join(group.sessions)}: succeeded but no host holds a finished "
                         "checkpoint")
    return next(name for name, count in counts.items() if count == most)
