"""Task: `doctor` — API drift, command-line flags, capabilities, model config and resources."""

from __future__ import annotations

from invoke import task

from remote.session import emit_json, reports_errors
from remote.tasks.shared import doctor_call, exchange_once, render_findings
from specops.contract import commandline


@task(help={"host": "inventory host", **commandline.DOCTOR.helps("run", "no_import"),
            "json": "one JSON document on stdout",
            "hosts": "several inventory hosts, comma-separated: in parallel, one row each",
            "all_": "every inventory host, in parallel, one row each",
            "site": "site folders on the host the packages are read from first (comma-separated), e.g. an env's "
                    "site-packages"})
@reports_errors
def doctor(c, host=None, run=None, json=False, hosts=None, all_=False, no_import=False, site=None):
    """Catch API drift and missing capabilities in seconds, before any model load.

    Without --run it judges the installed stack alone; launches always check their run."""
    from remote import render
    from remote.inventory import load_inventory
    from remote.several_hosts import chosen_hosts, run_across

    sites = [folder for folder in (site or "").split(",") if folder]
    inventory = load_inventory()
    several = chosen_hosts(inventory, host, hosts, all_)
    if several is not None:
        run_across(f"doctor — {f'run {run}' if run else 'installed stack'}", several, inventory,
                   lambda chosen, conn: doctor_call(conn, chosen, run, no_import=no_import, site=sites),
                   findings_summary,
                   json=json)
        return
    chosen, code, document = exchange_once(
        inventory, host, lambda chosen, conn: doctor_call(conn, chosen, run, no_import=no_import, site=sites),
        quick=True)
    if json:
        emit_json(document)
    elif code == 2:  # bad input (an unknown run, a bad config): one line on stderr, exit 2
        from remote.errors import BadInput
        from remote.tasks.shared import local_config_name

        raise BadInput(local_config_name(str(document.get("error")), run) if run else str(document.get("error")))
    elif "findings" in document:
        render_findings(document, f"doctor — {chosen.name} — {f'run {run}' if run else 'installed stack'}")
        counts: dict[str, int] = {}
        for finding in document["findings"]:
            counts[finding["result"]] = counts.get(finding["result"], 0) + 1
        summary = ", ".join(f"{count} {result}" for result, count in sorted(counts.items()))
        render.console().print(f"{render.status_text(document['ok'], 'OK' if document['ok'] else 'ERRORS')}: "
                               f"{summary} in {document['elapsed_s']} s")
    else:
        import sys

        print(f"specops: {document.get('error', 'doctor failed')}", file=sys.stderr)
    if code != 0:
        raise SystemExit(code)


def findings_summary(document: dict) -> str:
    """One line of a host's doctor findings: counts by result, then the first errors by name."""
    findings = document.get("findings")
    if findings is None:
        return str(document.get("error", "doctor failed"))
    counts: dict[str, int] = {}
    for finding in findings:
        counts[finding["result"]] = counts.get(finding["result"], 0) + 1
    line = ", ".join(f"{count} {result}" for result, count in sorted(counts.items()))
    errors = [finding["check"] for finding in findings if finding["result"] == "error"]
    if errors:
        line += f"; errors: {', '.join(errors[:4])}{' ...' if len(errors) > 4 else ''}"
    return line


TASKS = [doctor]
