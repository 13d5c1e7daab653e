"""`python -m specops job ...`: launch, list, show, stop and tail jobs that run under tmux.

Every command prints one JSON document, except `tail`, which prints JSON lines (one per chunk of
log, then a final {"done": true, ...}) and `wrap`, the process tmux runs, which prints nothing.
Each handler imports what only it needs: `job list`, the one `invoke status` waits for, starts lean.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from specops.contract.commandline import JOB_LAUNCH, JOB_LIST, JOB_SHOW, JOB_STOP, JOB_TAIL
from specops.contract.errors import BadInput
from specops.contract.protocol import ACTIVE_STATES, JOB_ID_VARIABLE, JobRecord, name_problem
from specops.host import paths
from specops.jobs import liveness, records
from specops.jobs.tmux import TmuxServer

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STATE_RECHECK_S = 1.0  # how often `tail --follow` asks tmux whether the job still exists

Result = tuple[int, dict[str, Any] | None]


def _server() -> TmuxServer:
    return TmuxServer(paths.workdir())


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not _ENV_NAME.fullmatch(key):
            raise BadInput(f"job launch --env {pair!r}: expected NAME=VALUE with NAME like [A-Za-z_][A-Za-z0-9_]*")
        env[key] = value
    return env


def _json_object(flag: str, text: str | None) -> dict[str, Any] | None:
    from specops.contract.values import json_object

    return json_object(f"job launch {flag}", text)


def _command(remainder: list[str]) -> list[str]:
    command = remainder[1:] if remainder[:1] == ["--"] else remainder
    if not command:
        raise BadInput("job launch: no command given (put it after --)")
    return command


def _name(text: str, flag: str = "--name") -> str:
    """Job and run names become file, folder and tmux session names: one safe pattern (protocol)."""
    problem = name_problem(text)
    if problem is not None:
        raise BadInput(f"job launch {flag}: {problem}")
    return text


def launch_handler(args: argparse.Namespace) -> Result:
    from specops.jobs.launching import AlreadyRunning, launch
    from specops.jobs.runlock import RunBusy, running_job

    name = _name(args.name)
    run = _name(args.run, "--run") if args.run is not None else None
    within = _name(args.within, "--within") if args.within else os.environ.get(JOB_ID_VARIABLE) or None
    try:
        record = launch(name=name, run=run, argv=_command(args.command), env=_env_pairs(args.env),
                        revision=_json_object("--revision", args.revision), meta=_json_object("--meta", args.meta),
                        wait=args.wait, within=within)
    except RunBusy as busy:  # a run's steps are exclusive: nothing was written
        return 2, {"ok": False, "exit_code": 2, "running_job": running_job(busy.holder), "holder": busy.holder,
                   "error": f"job launch --name {name}: {busy}"}
    except AlreadyRunning as refused:
        running = refused.record
        where = f" in run {run!r}" if run is not None else ""
        return 1, {"ok": False, "exit_code": 1, "running_job": running["id"],
                   "error": f"job {name!r}{where} is already running as {running['id']}; stop it first"}
    return 0, {"ok": True, "job": liveness.describe(record, _server())}


def _shown(every: list[JobRecord], include_all: bool) -> list[JobRecord]:
    """Everything with --all; otherwise the active jobs and the newest job of each name and run."""
    if include_all:
        return every
    newest = {(record["name"], record["run"]): record["id"] for record in every}
    return [record for record in every
            if record["id"] in newest.values() or record["state"] in ACTIVE_STATES]


def list_handler(args: argparse.Namespace) -> Result:
    from specops.host import gpus

    server = _server()
    jobs = [liveness.describe(record, server) for record in _shown(records.all_records(), args.all)]
    return 0, {"ok": True, "jobs": jobs, **gpus.usage()}


def show_handler(args: argparse.Namespace) -> Result:
    return 0, {"ok": True, "job": liveness.describe(records.resolve(args.job, args.run), _server())}


def stop_handler(args: argparse.Namespace) -> Result:
    from specops.jobs import stopping

    if args.grace < 0:
        raise BadInput(f"job stop --grace {args.grace}: must be zero or more seconds")
    server = _server()
    outcome = stopping.stop(records.resolve(args.job, args.run), args.grace, server)
    return 0, {"ok": True, "job": liveness.describe(outcome.record, server),
               "already_ended": outcome.already_ended, "signal": outcome.signal}


def _emit_line(document: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(document) + "\n")
    sys.stdout.flush()


def _start_offset(log: Path, offset: int | None, lines: int | None) -> int:
    from specops.jobs import logtail

    size = logtail.log_size(log)
    if offset is not None:
        if offset < 0 or offset > size:
            raise BadInput(f"job tail --offset {offset}: outside the log (0..{size} bytes)")
        return offset
    if lines is not None:
        if lines < 0:
            raise BadInput(f"job tail --lines {lines}: must be zero or more")
        return logtail.offset_of_last_lines(log, lines)
    return 0


def tail_handler(args: argparse.Namespace) -> Result:
    server = _server()
    record = liveness.refresh(records.resolve(args.job, args.run), server)
    log = Path(record["log"])
    offset = _start_offset(log, args.offset, args.lines)
    last_check = time.monotonic()

    def current_state() -> JobRecord:
        nonlocal last_check
        current = records.load(record["id"])
        if time.monotonic() - last_check >= _STATE_RECHECK_S:
            current = liveness.refresh(current, server)
            last_check = time.monotonic()
        return current

    from specops.jobs import logtail

    try:
        logtail.stream(log, offset, follow=args.follow, current_state=current_state, emit=_emit_line)
    except BrokenPipeError:
        # The reader went away (a dropped SSH connection); it resumes from its last offset.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0, None
    return 0, None


def wrap_handler(args: argparse.Namespace) -> Result:
    from specops.jobs import wrapper

    return wrapper.run_job(args.job_id), None


def register(subparsers: argparse._SubParsersAction) -> None:
    job = subparsers.add_parser("job", help="jobs that run under tmux on this host")
    actions = job.add_subparsers(dest="job_command", required=True)

    # launch, list, show, stop, tail: their flags are specs in specops.contract.commandline (the builders' too)
    JOB_LAUNCH.add_to(actions, launch_handler)
    JOB_LIST.add_to(actions, list_handler)
    JOB_SHOW.add_to(actions, show_handler)
    JOB_STOP.add_to(actions, stop_handler)
    JOB_TAIL.add_to(actions, tail_handler)

    wrap_parser = actions.add_parser("wrap", help="internal: the process tmux runs for a job")
    wrap_parser.add_argument("job_id")
    wrap_parser.set_defaults(handler=wrap_handler)
