"""Task: `doctor` — API drift, command-line flags, capabilities, model config and resources."""

from __future__ import annotations

import time

from invoke import task

from remote.session import emit_json, host_connection, reports_errors
from remote.tasks.shared import doctor_call, render_findings


@task(help={"host": "inventory host", "run": "also check this run's flags, model config and resources",
            "json": "one JSON document on stdout"})
@reports_errors
def doctor(c, host=None, run=None, json=False):
    """Catch API drift and missing capabilities in seconds, before any model load.

    Without --run it judges the installed stack alone; launches always check their run."""
    from remote import render

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
