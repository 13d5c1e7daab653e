"""Launching a job on a host and following it: the shared path of `run`, `extract`, `train`, ...

The task's one connection (its HostSession) launches (the agent bundle travels with that call if
the host is stale, so a launch always runs this checkout's code, and the job record keeps the
synced revision); following then streams the job's log by byte offset on the same connection,
reconnecting only after a drop. Ctrl-C stops following only.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from remote import journal
from remote.inventory import Host
from remote.jobs import follow_log, job_call
from remote.revision import current_revision
from remote.session import HostSession
from remote.ssh import Connection
from specops.contract import commandline
from specops.contract.protocol import JobState


@dataclass
class LaunchOutcome:
    job: dict[str, Any]
    state: str | None
    exit_code: int | None
    detached: bool
    last_document: dict[str, Any] | None  # the step's own JSON result, the last line of its log


def agent_step_command(host: Host, args: Sequence[str], env_role: str | None = None) -> list[str]:
    """The argv of a job that runs an agent command in the host's env."""
    return [host.env_python(env_role), "-m", "specops", *args]


def launch(conn: Connection, host: Host, name: str, command: Sequence[str], *, run: str | None,
           meta: dict[str, Any] | None = None, env: dict[str, str] | None = None, wait: bool = False) -> dict[str, Any]:
    """Job `name` on the host; refused (BadInput, exit 2, naming the holder) while another job or step of
    `run` runs there, unless `wait`: then it queues behind it."""
    document = job_call(conn, host, commandline.job_launch(name=name, command=list(command), run=run, env=env,
                                                          revision=current_revision(), meta=meta or {}, wait=wait))
    job = document["job"]
    journal.record("launch", host=host.name, job=job["id"], name=name, run=run, argv=list(command))
    return job


def _last_json_line(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            return value if isinstance(value, dict) else None
    return None


def follow(session: HostSession, job_id: str, *, record: dict[str, Any] | None = None, quiet: bool = False,
           lines: int | None = None, raw: bool = False, stream: TextIO | None = None) -> LaunchOutcome:
    """Stream a job's log until it ends (or Ctrl-C), as remote.step_view shows it; remember its final
    JSON line.

    The log's lines go to `stream` (stderr by default: a step's --json owns stdout); specops' own
    notices always go to stderr. On the session's connection; `record` (the launch's answer) spares
    asking the host for it. `raw`: the log exactly as it is (`invoke logs --follow`), no step view.
    """
    from remote.step_view import StepView

    host = session.host
    tail = {"text": ""}
    view = StepView(stream or sys.stderr)  # the log less the step's JSON result; the trainer as progress bars

    def on_text(text: str) -> None:
        tail["text"] = (tail["text"] + text)[-65536:]
        if quiet:
            return
        out = stream or sys.stderr
        if raw:
            out.write(text)
            out.flush()
        else:
            view.feed(text)

    def on_notice(message: str) -> None:
        sys.stderr.write(f"specops: {message}\n")

    outcome = follow_log(host, job_id, 0 if lines is None else None, on_text, lines=lines, on_notice=on_notice,
                         session=session, record=record)
    if not quiet and not raw:
        view.close(failed=not outcome.interrupted and outcome.state != JobState.SUCCEEDED)
    if outcome.interrupted:
        sys.stderr.write(f"\nspecops: detached; job {job_id} keeps running on {host.name}. Reattach with:\n"
                         f"  invoke logs --host {host.name} --job {job_id} --follow\n")
    return LaunchOutcome({"id": job_id}, outcome.state, outcome.exit_code, outcome.interrupted,
                         _last_json_line(tail["text"]))

