"""Several inventory hosts at once: `--hosts a,b` or `--all`, one exchange per host in parallel
(`remote.ssh.fan_out`, the one way to work on several hosts at once); `first_failure` raises the first
host's error of a fan-out.

The per-host work is the same function a task runs against one host (`exchange(host, conn) ->
(exit code, document)`); `across` runs it on every chosen host through `remote.ssh.fan_out`, so
each host gets its own verified connection and one host failing (unreachable, bad key, a failed
check) never hides the others. The result is one row per host, rendered as one table or one JSON
document `{"ok", "hosts": [{host, exit_code, ok, summary, document}], "elapsed_s"}`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from remote.errors import AgentError, BadInput, SpecopsError

if TYPE_CHECKING:
    from remote.inventory import Host, Inventory
    from remote.ssh import Connection, HostOutcome

Exchange = Callable[["Host", "Connection"], tuple[int, dict[str, Any]]]


def chosen_hosts(inventory: Inventory, host: str | None, hosts: str | None, all_hosts: bool) -> list[Host] | None:
    """The hosts named by --hosts a,b or --all; None when neither was given (a one-host task)."""
    if not hosts and not all_hosts:
        return None
    if host:
        raise BadInput("--host and --hosts/--all exclude each other: give one host or several")
    if hosts and all_hosts:
        raise BadInput("--hosts and --all exclude each other")
    if all_hosts:
        return list(inventory.hosts.values())
    names = distinct_names([name.strip() for name in str(hosts).split(",")], "--hosts")
    return [inventory.host(name) for name in names]


def distinct_names(names: list[str], where: str) -> list[str]:
    """Host names as a user wrote them (--hosts, a run's `hosts:`): none empty, none twice; else one line."""
    if any(not name for name in names):
        raise BadInput(f"{where}: {','.join(names)!r} has an empty name (write host names separated by commas)")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise BadInput(f"{where}: {duplicates[0]!r} is named twice")
    return names


@dataclass
class HostRow:
    host: str
    exit_code: int
    document: dict[str, Any]
    summary: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "ok": self.ok, "exit_code": self.exit_code, "summary": self.summary,
                "document": self.document}


def across(hosts: list[Host], inventory: Inventory, exchange: Exchange,
           summarise: Callable[[dict[str, Any]], str]) -> list[HostRow]:
    """`exchange` on every host in parallel; one row per host, in the order the hosts were named."""
    from remote.bundle import build_bundle
    from remote.ssh import fan_out

    build_bundle()  # once, before the threads: each would otherwise hash the checkout itself
    results: dict[str, tuple[int, dict[str, Any], float]] = {}

    def one(host: Host, conn: Connection) -> None:
        started = time.perf_counter()
        code, document = exchange(host, conn)
        results[host.name] = (code, document, time.perf_counter() - started)

    outcomes = fan_out(hosts, one, inventory=inventory)
    rows = []
    for host in hosts:
        error = outcomes[host.name].error
        if error is not None:
            code = error.exit_code if isinstance(error, SpecopsError) else 1
            rows.append(HostRow(host.name, code, {"ok": False, "error": str(error)}, str(error)))
            continue
        code, document, elapsed = results[host.name]
        document = {**document, "host": host.name, "elapsed_s": round(elapsed, 3)}
        summary = summarise(document)
        if code != 0 and document.get("error"):
            summary = str(document["error"])
        rows.append(HostRow(host.name, code, document, summary))
    return rows


def exit_code(rows: list[HostRow]) -> int:
    """0 when every host is fine; else the worst: 2 (bad input somewhere) over 1 (a check failed)."""
    codes = {row.exit_code for row in rows}
    if codes <= {0}:
        return 0
    return 2 if 2 in codes else 1


def fleet_document(rows: list[HostRow], started: float) -> dict[str, Any]:
    return {"ok": exit_code(rows) == 0, "hosts": [row.as_dict() for row in rows],
            "elapsed_s": round(time.perf_counter() - started, 3)}


def render_rows(title: str, rows: list[HostRow], started: float) -> None:
    from remote import render

    out = render.console()
    view = render.table(title, ["host", "result", "summary", "s"])
    for row in rows:
        view.add_row(row.host, render.status_text(row.ok, "ok" if row.ok else f"FAILED (exit {row.exit_code})"),
                     row.summary, f"{row.document.get('elapsed_s', '-')}")
    out.print(view)
    failed = sum(not row.ok for row in rows)
    verdict = "OK" if not failed else f"{failed} of {len(rows)} host(s) FAILED"
    out.print(f"{render.status_text(not failed, verdict)} in {round(time.perf_counter() - started, 3)} s")


def run_across(title: str, hosts: list[Host], inventory: Inventory, exchange: Exchange,
               summarise: Callable[[dict[str, Any]], str], *, json: bool,
               totals: Callable[[list[HostRow]], dict[str, Any]] | None = None) -> None:
    """The whole multi-host task: fan out, print one table (or one JSON document), exit with the worst.

    `totals` adds figures over all hosts (status: the total ETA) to the document and under the table."""
    from remote import render
    from remote.session import emit_json

    started = time.perf_counter()
    rows = across(hosts, inventory, exchange, summarise)
    overall = totals(rows) if totals else {}
    if json:
        emit_json({**fleet_document(rows, started), **overall})
    else:
        render_rows(title, rows, started)
        for key, value in overall.items():
            render.console().print(f"{key.replace('_', ' ')}: {value}")
    code = exit_code(rows)
    if code:
        raise SystemExit(code)


def first_failure(outcomes: dict[str, HostOutcome[Any]], what: str, after: str = "") -> None:
    """Raise the first host's error of a fan-out (`remote.ssh.fan_out`), naming the host (bad input wins:
    exit 2); an error that is not one of ours (a bug) is raised as it is, traceback and all."""
    failed = {name: outcome.error for name, outcome in outcomes.items() if outcome.error is not None}
    if not failed:
        return
    name, error = next(((n, e) for n, e in failed.items() if isinstance(e, BadInput)), next(iter(failed.items())))
    if isinstance(error, BadInput):
        raise BadInput(str(error))
    if not isinstance(error, SpecopsError):
        raise error
    raise AgentError(f"{what} on {name}: {error}{after}" if len(outcomes) > 1 else f"{error}{after}")
