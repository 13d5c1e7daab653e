"""Task: `doctor` — API drift, command-line flags, capabilities, model config and resources."""

from __future__ import annotations

import time
from typing import Any

from invoke import task

from remote import render
from remote.agent import agent_call
from remote.connection import Connection
from remote.errors import AgentError
from remote.inventory import Host
from remote.session import emit_json, host_connection, reports_errors


def doctor_call(conn: Connection, host: Host, run: str | None) -> tuple[int, dict[str, Any]]:
    args = ["doctor"]
    if run:
        args += ["--run", run]
    result = agent_call(conn, host, args, timeout=120)
    return result.exit_code, result.document


def render_findings(document: dict[str, Any], title: str, *, only_problems: bool = False) -> None:
    out = render.console()
    view = render.table(title, ["check", "result", "where", "why", "how to fix"])
    colour = {"ok": True, "error": False, "warn": None, "unknown": None}
    for finding in document.get("findings", []):
        if only_problems and finding["result"] == "ok":
            continue
        view.add_row(finding["check"], render.status_text(colour.get(finding["result"]), finding["result"]),
                     finding.get("where") or "", finding.get("why") or "", finding.get("fix") or "")
    out.print(view)


def preflight(conn: Connection, host: Host, run: str, skip: bool) -> dict[str, Any]:
    """The doctor before a launch: refuse to start on any error, unless skipped (and recorded)."""
    if skip:
        return {"skipped": True}
    code, document = doctor_call(conn, host, run)
    if code == 2:
        raise AgentError(f"{host.name}: doctor: {document.get('error')}")
    if not document.get("ok"):
        render_findings(document, f"doctor refused the launch on {host.name}", only_problems=True)
        errors = [finding for finding in document.get("findings", []) if finding["result"] == "error"]
        raise AgentError(f"doctor found {len(errors)} error(s) on {host.name}; fix them or pass --skip-doctor")
    return {"skipped": False, "ok": True, "timing_s": document.get("timing_s")}


@task(help={"host": "inventory host", "run": "also check this run's flags, model config and resources",
            "json": "one JSON document on stdout"})
@reports_errors
def doctor(c, host=None, run=None, json=False):
    """Catch API drift and missing capabilities in seconds, before any model load.

    Without --run it judges the installed stack alone; launches always check their run."""
    started = time.perf_counter()
    with host_connection(host) as (chosen, conn):
        code, document = doctor_call(conn, chosen, run)
        trips = conn.round_trips
    document = {**document, "host": chosen.name, "round_trips": trips,
                "elapsed_s": round(time.perf_counter() - started, 3)}
    if json:
        emit_json(document)
    elif "findings" in document:
        render_findings(document, f"doctor — {chosen.name} — {f'run {run}' if run else 'installed stack'}")
        counts: dict[str, int] = {}
        for finding in document["findings"]:
            counts[finding["result"]] = counts.get(finding["result"], 0) + 1
        summary = ", ".join(f"{count} {result}" for result, count in sorted(counts.items()))
        render.console().print(f"{render.status_text(document['ok'], 'OK' if document['ok'] else 'ERRORS')}: "
                               f"{summary} in {document['elapsed_s']} s")
    else:
        render.console().print(render.status_text(False, document.get("error", "doctor failed")))
    if code != 0:
        raise SystemExit(code)


TASKS = [doctor]
