"""Tasks of the pipeline: regenerate, prepare, extract, validate, vocab, train, evaluate, pipeline, fetch.
What they print for people is remote/tasks/pipeline_views.py; a pipeline across hosts, and a training across
hosts (the same engine entered with its train step), is remote.pipeline_nodes.

Each step runs as a job under tmux on the host (it survives disconnects) and is followed by
default; --detach returns at once. extract, train and pipeline run the doctor first and refuse
to start on an error (--skip-doctor skips it, and the job record says so). Each task talks to its
host through one connection: doctor, launch, following the log and fetching the results.
"""

from __future__ import annotations

import sys
from typing import Any

from invoke import task

from remote.errors import AgentError, BadInput
from remote.session import HostSession, emit_json, fail, host_session, reports_errors
from remote.tasks.pipeline_views import (
    fetched_text,
    render_compare,
    render_coverage,
    render_evaluation,
    render_summary,
    render_sweep,
    render_train_sweep,
)
from remote.tasks.shared import check_run, preflight, render_epochs
from specops.contract import commandline
from specops.contract.commandline import SERVE_PYTHON_ENV
from specops.contract.protocol import JobState
from specops.contract.values import whole_flag

STEP_HELP = {"host": "inventory host (default: the inventory's default)",
             "run": "run config runs/NAME.yaml (default: the host's run)",
             "detach": "return at once with the job id; follow later with invoke logs --follow",
             "wait": commandline.WAIT_HELP,
             "json": "one JSON document on stdout (the step's result)"}


def chosen_run(session: HostSession, run: str | None) -> str:
    """--run, else the host's run (inventory); the builders of specops.contract.commandline check the name."""
    return run or session.host.run


def run_step_job(session: HostSession, run_name: str, name: str, argv: list[str], *, detach: bool,
                 json: bool, doctor: bool = False, skip_doctor: bool = False,
                 env_role: str | None = None,
                 wait: bool = False, backend: str | None = None) -> dict[str, Any] | None:
    """Launch `python -m specops <argv>` (built by specops.contract.commandline) as job `name`, follow it, return its
    JSON result.

    All on the session's one connection. The job runs in the env of `env_role` (the default env without) and
    gets the host's serve env (Host.job_env), as every job of a run does.
    """
    from remote.launch import agent_step_command, follow, launch

    host, conn = session.host, session.conn
    # bad config, or the run busy here: exit 2 before any job, record or output exists; `backend` (the run's,
    # extract's --backend): run check, the doctor and the step make the run's settings with the same one
    env = host.job_env()  # every step job: the steps it reads may serve (prepare runs regenerate)
    check_run(conn, host, run_name, refuse_busy=not wait, backend=backend, launch=argv,
              serve_python=env.get(SERVE_PYTHON_ENV))
    meta: dict[str, Any] = {}
    if doctor:
        meta["doctor"] = preflight(conn, host, run_name, skip_doctor, backend)
    job = launch(conn, host, name, agent_step_command(host, argv, env_role), run=run_name, meta=meta, env=env,
                 wait=wait)
    print(f"specops: job {job['id']} ({name}, run {run_name}) started on {host.name}", file=sys.stderr)
    if detach:
        if json:
            emit_json({"ok": True, "job": job})
        else:
            print(job["id"])
        return None
    outcome = follow(session, job["id"], record=job)
    if outcome.detached:
        raise SystemExit(0)
    result = outcome.last_document
    if json and result is not None:
        emit_json({**result, "job": job["id"], "state": outcome.state, "exit_code": outcome.exit_code})
    if outcome.state != JobState.SUCCEEDED:
        reason = ((result or {}).get("error") or (validation_verdict(result) if result and "checks" in result else None)
                  or f"exit code {outcome.exit_code}")
        error = BadInput if outcome.exit_code == 2 else AgentError  # the job's exit code is the task's: one rule
        raise error(f"{name} on {host.name}: job {job['id']} {outcome.state}: {reason}")
    print(f"specops: {name} on {host.name}: succeeded", file=sys.stderr)
    said_of_servers((result or {}).get("vllm_servers"))
    return result


def said_of_servers(servers: dict[str, Any] | None) -> None:
    """The last word on the run's vLLM server once a step or the pipeline ended (the engine's account,
    vllm.serving): kept (which, how long, how to stop it) or stopped; nothing where the command served none."""
    if not servers:
        return
    if servers.get("stays"):
        print(f"specops: {servers['stays']}", file=sys.stderr)
    elif servers.get("stopped"):
        print(f"specops: the run's vLLM server was stopped ({servers['stopped']}): vllm.keep_server is false",
              file=sys.stderr)


@task(help={**STEP_HELP, **commandline.STEPS["regenerate"].helps("backend", "stop_server", "port")})
@reports_errors
def regenerate(c, host=None, run=None, backend=None, stop_server=False, port=None, detach=False, wait=False,
               json=False):
    """The target answers the conversations' prompts itself (resumes after an interruption)."""
    with host_session(host) as session:
        run_name = chosen_run(session, run)
        argv = commandline.step_regenerate(run=run_name, backend=backend or None, stop_server=stop_server, port=port)
        result = run_step_job(session, run_name, "regenerate", argv, detach=detach, wait=wait, json=json)
    if result and not json:
        counts = result.get("counts") or {}
        print(f"regenerated {counts.get('rows')} answers for {counts.get('conversations')} conversations "
              f"({counts.get('failed')} failed, {counts.get('empty')} empty, {counts.get('held_out')} held out): "
              f"{result.get('output')}")


@task(help={**STEP_HELP, **commandline.STEPS["prepare"].helps("samples", "strict", "retire")})
@reports_errors
def prepare(c, host=None, run=None, samples=None, strict=False, retire=False, detach=False, wait=False, json=False):
    """Tokenise with the target's chat template, assistant-only loss mask, token frequencies."""
    with host_session(host) as session:
        run_name = chosen_run(session, run)
        argv = commandline.step_prepare(run=run_name, samples=samples, strict=strict, retire=retire)
        run_step_job(session, run_name, "prepare", argv, detach=detach, wait=wait, json=json)


@task(help={**STEP_HELP, **commandline.STEPS["extract"].helps("samples", "backend", "stop_server", "port", "retire"),
            "skip_doctor": "do not run the doctor first (recorded in the job record)"})
@reports_errors
def extract(c, host=None, run=None, samples=None, backend=None, skip_doctor=False, stop_server=False, port=None,
            retire=False, detach=False, wait=False, json=False):
    """Capture the target's hidden states at the run's layers (regenerate and prepare first when needed).

    With the vllm backend the host's `vllm-server` job of the run is reused when its model, layers,
    dtype, serve args and vLLM version match, else (re)started from the host's `envs.serve`.
    """
    with host_session(host) as session:
        run_name = chosen_run(session, run)
        argv = commandline.step_extract(run=run_name, samples=samples, backend=backend or None, stop_server=stop_server,
                                       port=port, retire=retire)
        run_step_job(session, run_name, "extract", argv, detach=detach, wait=wait, json=json, doctor=True,
                     skip_doctor=skip_doctor, backend=backend or None)


@task(help={**STEP_HELP, **commandline.STEPS["validate"].helps("fidelity_samples")})
@reports_errors
def validate(c, host=None, run=None, fidelity_samples=4, detach=False, wait=False, json=False):
    """Check every hidden-state file, and their fidelity against the target's own predictions."""
    with host_session(host) as session:
        run_name = chosen_run(session, run)
        argv = commandline.step_validate(run=run_name, fidelity_samples=fidelity_samples)
        result = run_step_job(session, run_name, "validate", argv, detach=detach, wait=wait, json=json)
    if result and not json:
        print(validation_verdict(result))


def validation_verdict(result: dict[str, Any]) -> str:
    """validate's verdict on one line: the files checked and bad, the fidelity agreement against the target."""
    checks = result.get("checks") or {}
    files = (checks.get("files") or {}).get("detail") or {}
    fidelity = (checks.get("fidelity") or {}).get("detail") or {}
    agreement = fidelity.get("agreement")
    said = [f"{files.get('checked', '?')} files, {files.get('bad', '?')} bad"]
    if agreement is not None:
        said.append(f"fidelity {agreement:.3f} agreement with the target's next tokens (threshold "
                    f"{fidelity.get('threshold')}, {fidelity.get('decidable')} positions, reference "
                    f"{fidelity.get('reference')})")
    elif fidelity.get("reason"):
        said.append(f"fidelity unknown: {fidelity['reason']}")
    verdict = "OK" if result.get("ok") else "FAILED"
    skipped = " (unchanged since the last check)" if str(result.get("status", "")).startswith("skipped") else ""
    return f"validate: {verdict}{skipped}: {'; '.join(said)}"


@task(help={**STEP_HELP})
@reports_errors
def vocab(c, host=None, run=None, detach=False, wait=False, json=False):
    """The draft vocabulary (d2t/t2d) from token frequencies, with a coverage table."""
    with host_session(host) as session:
        run_name = chosen_run(session, run)
        result = run_step_job(session, run_name, "vocab", commandline.step_vocab(run=run_name), detach=detach,
                              wait=wait,
                              json=json)
    if result and not json:
        render_coverage(result)


@task(help={**STEP_HELP, **commandline.STEPS["train"].helps("epochs", "gpus", "fresh", "sweep"),
            "skip_doctor": "do not run the doctor first (recorded in the job record)",
            "hosts": "train across these inventory hosts (comma-separated): the engine on each, one torchrun "
                     "node each; one failing or silent host stops them all",
            "port": "with --hosts: the rendezvous port on the first host (default 29400; the training meets at "
                    "PORT+1)"}, iterable=["sweep"])
@reports_errors
def train(c, host=None, run=None, epochs=None, gpus=None, fresh=False, skip_doctor=False, detach=False, wait=False,
          json=False, hosts=None, port=None, sweep=None):
    """Train the EAGLE-3 draft with speculators (resumes from its newest checkpoint); --sweep: several settings
    from the same extraction, each scored, the best named."""
    if hosts and sweep:
        raise BadInput("--sweep: one host at a time (--host); its settings train one after another")
    if hosts and wait:
        raise BadInput("--wait: one host at a time (--host); across hosts the engines meet at a rendezvous that "
                       "would not wait that long")
    if hosts:
        train_on_hosts(hosts, host, run, epochs=epochs, gpus=gpus, fresh=fresh, skip_doctor=skip_doctor,
                       detach=detach, json=json, port=port)
        return
    with host_session(host) as session:
        run_name = chosen_run(session, run)
        argv = commandline.step_train(run=run_name, epochs=epochs, gpus=gpus, fresh=fresh, sweep=sweep or None)
        result = run_step_job(session, run_name, "train", argv, detach=detach, wait=wait, json=json, doctor=True,
                              skip_doctor=skip_doctor, env_role="train")
    if result and not json:
        if result.get("sweep"):
            render_train_sweep(result["sweep"])
        else:
            render_epochs(result.get("metrics") or [])


def train_on_hosts(hosts: str, host: str | None, run: str | None, *, epochs: Any, gpus: Any, fresh: bool,
                   skip_doctor: bool, detach: bool, json: bool, port: Any) -> None:
    """`train --hosts a,b`: the run's engine on every host entered with the train step alone
    (remote.pipeline_nodes, as `pipeline --hosts`), followed on the first host."""
    from remote.inventory import load_inventory
    from remote.names import safe_name
    from remote.pipeline_nodes import RDZV_PORT, Alone, pipeline_on_hosts
    from remote.several_hosts import chosen_hosts

    inventory = load_inventory()
    members = chosen_hosts(inventory, host, hosts, False) or []
    if len(members) < 2:
        raise BadInput("--hosts: a training across hosts needs at least two")
    if gpus is not None or detach:
        raise BadInput("--hosts: --gpus and --detach are per host; each node trains on all its GPUs, followed")
    run_name = safe_name(run or members[0].run, "--run")
    rdzv_port, epochs = whole_flag(port, "--port") or RDZV_PORT, whole_flag(epochs, "--epochs")
    alone = Alone("train", epochs=epochs, fresh=fresh)
    launch_argv = commandline.pipeline(run=run_name, only="train", epochs=epochs, fresh=fresh)  # checked here

    def check(conn, member, rank):  # the config and the run busy there, then the doctor: exit 2 before any job
        checked = check_run(conn, member, run_name, refuse_busy=True, launch=launch_argv,
                            serve_python=member.envs.get("serve"), rank=rank)
        return {**checked, "preflight": preflight(conn, member, run_name, skip_doctor)}

    names = ", ".join(member.name for member in members)
    try:
        jobs, summary = pipeline_on_hosts(members, inventory, run_name, check, samples=None, backend=None,
                                          skip_patches=False, no_fetch=True, detach=False, port=rdzv_port,
                                          alone=alone)
    except AgentError as exc:
        if json:  # one document, the failure in it (the error alone would print a second one)
            emit_json({"ok": False, "run": run_name, "hosts": [member.name for member in members],
                       "error": str(exc), "exit_code": 1})
        raise fail(str(exc), 1) from None
    summary = summary or {}
    if json:
        emit_json({**summary, "jobs": jobs})
        return
    render_epochs(summary.get("epochs") or [])
    print(f"specops: train across {names}: succeeded (saved on {summary.get('saved_on')})", file=sys.stderr)


@task(help={**STEP_HELP, **commandline.STEPS["evaluate"].helps(
    "checkpoint", "all_epochs", "prompts", "backend", "sweep", "concurrency", "compare", "rounds", "reproduce",
    set_="sets")},
      iterable=["set_"])
@reports_errors
def evaluate(c, host=None, run=None, checkpoint=None, all_epochs=False, prompts=None, backend=None, detach=False,
             wait=False, json=False, sweep=None, concurrency=None, compare=None, rounds=None, set_=None,
             reproduce=None):
    """The draft's acceptance as the target's EAGLE-3 speculator, on held-out prompts; --compare: speculators side
    by side (none, ngram, suffix, the trained kinds), tokens/s and the best."""
    with host_session(host) as session:
        run_name = chosen_run(session, run)
        argv = commandline.step_evaluate(run=run_name, checkpoint=checkpoint, all_epochs=all_epochs, prompts=prompts,
                                        backend=backend or None, sweep=sweep, concurrency=concurrency,
                                        compare=compare or None, rounds=rounds, sets=set_pairs(set_),
                                        reproduce=reproduce or None)
        result = run_step_job(session, run_name, "evaluate", argv, detach=detach, wait=wait, json=json,
                              env_role="train")
    if result and not json:
        if result.get("compare"):
            render_compare(result["compare"])
        elif result.get("sweep"):
            render_sweep(result["sweep"])
        else:
            render_evaluation(result)


def set_pairs(items: list[str] | None) -> dict[str, str] | None:
    """--set NAME=FILE items as {NAME: FILE}; a malformed one is bad input (exit 2)."""
    pairs = {}
    for item in items or []:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise BadInput(f"--set {item!r}: expected NAME=FILE")
        pairs[name] = file
    return pairs or None


def with_steps(body):
    """The task's docstring lists the steps of the step table (specops.contract.step_table), the one place they are."""
    from specops.contract.step_table import sequence

    body.__doc__ = body.__doc__.replace("{steps}", sequence())
    return body


@task(help={**STEP_HELP, **commandline.PIPELINE.helps("samples", "backend", "skip_patches"),
            "skip_doctor": "do not run the doctor first (recorded in the job record)",
            "no_fetch": "leave the results on the host",
            "hosts": "across these inventory hosts (comma-separated; default: the run's hosts:): one engine a "
                     "host, each extracts its share, every host gets every file, one training across them; "
                     "or by role, serve=a,b;train=c: the serve hosts' vLLM servers feed the train host's trainer",
            "port": "with several hosts: the rendezvous port on the first host (default 29400; the training "
                    "meets at PORT+1)",
            "detach": "return at once with the first host's job id; the run goes on without this machine"})
@reports_errors
@with_steps
def pipeline(c, host=None, run=None, samples=None, backend=None, skip_doctor=False, skip_patches=False,
             no_fetch=False, detach=False, wait=False, json=False, hosts=None, port=None):
    """doctor, then {steps}, then fetch.

    The doctor checks every host before anything is launched; then the engine runs on the host(s) as
    a tmux job (one a host across several: --hosts, or the run's hosts:), and this machine follows it
    (--detach: returns at once). Unchanged steps skip; regenerate and evaluate run when the run config
    enables them. The same command again attaches to a run's engine that is still running."""
    from remote.inventory import load_inventory
    from remote.names import safe_name
    from remote.pipeline_nodes import RDZV_PORT, members, pipeline_on_hosts, train_hosts

    inventory = load_inventory()
    chosen = members(inventory, safe_name(run or inventory.host(host).run, "--run"), host, hosts)
    training_hosts = train_hosts(safe_name(run or chosen[0].run, "--run"), hosts) if len(chosen) > 1 else None
    run_name = safe_name(run or chosen[0].run, "--run")
    if wait and len(chosen) > 1:
        raise BadInput("--wait: one host at a time (across hosts the engines meet at a rendezvous that would "
                       "not wait that long)")
    chosen_samples = whole_flag(samples, "--samples")
    launch_argv = commandline.pipeline(run=run_name, samples=chosen_samples,
                                       backend=backend or None)  # checked before any host
    rendezvous_port = whole_flag(port, "--port") or RDZV_PORT

    def check(conn, member, rank):  # the run busy on a host (another job of it): exit 2 before the doctor
        checked = check_run(conn, member, run_name, refuse_busy=not wait, pipeline=True, backend=backend or None,
                            launch=launch_argv, serve_python=member.envs.get("serve"), rank=rank)
        return {**checked, "preflight": preflight(conn, member, run_name, skip_doctor, backend or None,
                                                  as_patched=not skip_patches)}

    jobs, summary = pipeline_on_hosts(chosen, inventory, run_name, check, samples=chosen_samples,
                                      backend=backend or None, skip_patches=skip_patches, no_fetch=no_fetch,
                                      detach=detach, port=rendezvous_port, wait=wait, train=training_hosts)
    first = chosen[0].name
    if summary is None:  # detached
        if json:
            emit_json({"ok": True, "job": {"id": jobs[first], "host": first}, "jobs": jobs})
        else:
            print(jobs[first])
        return
    if json:
        emit_json(summary)
        return
    render_epochs(summary.get("epochs") or [])
    render_evaluation(summary.get("evaluation"))
    render_summary(summary)
    said_of_servers(summary.get("servers"))


@task(help={"host": "inventory host", "run": "run config (default: the host's run)",
            **commandline.FETCH_LIST.helps("with_training_state"), "json": "one JSON document on stdout",
            "hosts": "a run trained across these hosts (comma-separated): fetch from the first that holds a "
                     "finished checkpoint (the one that saved)"})
@reports_errors
def fetch(c, host=None, run=None, with_training_state=False, json=False, hosts=None):
    """Bring the newest finished checkpoint, metrics, plots, evaluation and logs home to fetched/<host>/<run>/,
    hash-verified.

    Safe while training runs: the host snapshots the files first (the log up to a recorded offset).
    """
    from remote.fetch import fetch_from_saver, fetch_run

    if hosts:
        document = fetch_from_saver(host, hosts, run, with_training_state=with_training_state)
    else:
        with host_session(host) as session:
            chosen = session.host
            document = fetch_run(session.conn, chosen, run or chosen.run, with_training_state=with_training_state)
    if json:
        emit_json(document)
        return
    print(fetched_text(document))


@task(help={"host": "inventory host (default: the inventory's default)",
            "run": "run config runs/NAME.yaml (default: the host's run)",
            **commandline.RUN_RESTORE.helps("retired"),
            "json": "one JSON document on stdout"})
@reports_errors
def restore(c, host=None, run=None, retired=None, json=False):
    """Undo a retirement: bring the trained draft, its vocab and evaluation set aside in runs/NAME/retired/
    back (what is there now of those steps is set aside in its turn)."""
    from remote.agent import agent_call

    with host_session(host) as session:
        run_name = chosen_run(session, run)
        result = agent_call(session.conn, session.host, commandline.run_restore(run=run_name, retired=retired or None))
    if result.exit_code == 2:
        raise BadInput(str(result.document.get("error")))
    if result.exit_code != 0:
        raise AgentError(f"restore on {session.host.name}: {result.document.get('error')}")
    if json:
        emit_json(result.document)
        return
    document = result.document
    print(f"restored {', '.join(document['restored'])} ({', '.join(document['folders'])}) of run {run_name} from "
          f"{document['from']}" + (f"; what was there is now in {document['retired_now']}"
                                   if document.get("retired_now") else ""))


TASKS = [regenerate, prepare, extract, validate, vocab, train, evaluate, pipeline, fetch, restore]
