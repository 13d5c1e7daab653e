"""What several task groups share: one host's exchange timed and counted, the doctor before a launch,
its findings table and the epochs table. Public names only; task modules import from here, never from each
other. (A task's own number flags are read with specops.contract.values.whole_flag, as the builders read them.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from remote.errors import AgentError, BadInput
from specops.contract import commandline

if TYPE_CHECKING:
    from remote.inventory import Host, Inventory
    from remote.ssh import Connection


def exchange_once(inventory: Inventory, host_name: str | None,
                  exchange: Callable[[Host, Connection], tuple[int, dict[str, Any]]], *,
                  accept_new_host_key: bool = False, quick: bool = False) -> tuple[Host, int, dict[str, Any]]:
    """A one-host task's exchange through one connection: the host, the exit code, and the document
    with `host`, `round_trips` and `elapsed_s` added (what check, doctor and status report).
    `quick`: the exchange only reads, so it may ride a shared OpenSSH master (open_connection)."""
    from remote.session import HostSession

    started = time.perf_counter()
    with HostSession(inventory.host(host_name), inventory, accept_new_host_key=accept_new_host_key,
                     quick=quick) as session:
        code, document = exchange(session.host, session.conn)
        trips = session.round_trips
    return session.host, code, {**document, "host": session.host.name, "round_trips": trips,
                                "elapsed_s": round(time.perf_counter() - started, 3)}


DOCTOR_TIMEOUT_S = 600
RUN_CHECK_TIMEOUT_S = 300


def doctor_call(conn: Connection, host: Host, run: str | None,
                backend: str | None = None, as_patched: bool = False,
                no_import: bool = False, site: list[str] | None = None) -> tuple[int, dict[str, Any]]:
    """The doctor on the host; with a run, as the command line will run it (`backend`: its --backend) and with
    vLLM judged in the host's serve env (inventory envs.serve), where the run's server runs."""
    from remote.agent import agent_call

    # A cold doctor imports the run's packages in a child python (torch, transformers: a minute on a
    # loaded 2-core machine, more on a busy host); a dead host is caught sooner by the liveness check.
    argv = commandline.doctor(run=run, backend=backend if run else None,
                              serve_python=host.envs.get("serve") if run else None, as_patched=as_patched,
                              no_import=no_import, site=site or None)
    result = agent_call(conn, host, argv, timeout=DOCTOR_TIMEOUT_S)
    return result.exit_code, result.document


def check_run(conn: Connection, host: Host, run: str, *, refuse_busy: bool = False,
              pipeline: bool = False, backend: str | None = None, launch: list[str] | None = None,
              serve_python: str | None = None, rank: int = 0) -> dict[str, Any]:
    """The run config checked on the host BEFORE anything is launched (keys and values, and layer_ids
    against the target's layers): bad is one line naming this checkout's file, exit 2, nothing written.
    `refuse_busy`: also exit 2 when another job or step of the run runs there (before the doctor; the
    launch decides for good). `pipeline`: the check before a whole pipeline (what its later steps need);
    `backend`: the run's --backend of the pipeline or step launched (else the run's own). `launch`: the agent
    argv about to be launched, whose own checks that need no model (its checkpoint, rows that would retire a
    training) come now. `serve_python`: the serve env the launched job's environment will name (its
    SPECOPS_SERVE_PYTHON): the run is judged with that env's vLLM, as the job will run it. `rank`: the host's
    place among the run's hosts (its server's port is vllm.port + rank, as its engine's)."""
    from remote.agent import agent_call

    argv = commandline.run_check(run=run, pipeline=pipeline, backend=backend, serve_python=serve_python,
                                 node_rank=rank or None, launch=launch)
    result = agent_call(conn, host, argv, timeout=RUN_CHECK_TIMEOUT_S)
    if result.exit_code == 2:
        raise BadInput(local_config_name(str(result.document.get("error")), run))
    if result.exit_code != 0:
        raise AgentError(f"{host.name}: run check of {run}: {result.document.get('error')}")
    if refuse_busy and result.document.get("busy"):
        raise BadInput(f"{host.name}: {result.document['busy']['error']}")
    return result.document


def local_config_name(message: str, run: str) -> str:
    """The host names its copy `runs/RUN.yaml`; a person edits the file here (SPECOPS_RUNS_DIR or runs/)."""
    from pathlib import Path

    from remote.bundle import runs_dir

    local = runs_dir() / f"{run}.yaml"
    try:
        shown = local.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        shown = str(local)
    host_label = f"runs/{run}.yaml"
    return shown + message[len(host_label):] if message.startswith(host_label) else message


def render_findings(document: dict[str, Any], title: str, *, only_problems: bool = False) -> None:
    from remote import render

    out = render.console()
    view = render.table(title, ["check", "result", "where", "why", "how to fix"])
    colour = {"ok": True, "error": False, "warn": None, "unknown": None}
    for finding in document.get("findings", []):
        if only_problems and finding["result"] == "ok":
            continue
        view.add_row(finding["check"], render.status_text(colour.get(finding["result"]), finding["result"]),
                     finding.get("where") or "", finding.get("why") or "", finding.get("fix") or "")
    out.print(view)


def preflight(conn: Connection, host: Host, run: str, skip: bool, backend: str | None = None,
              as_patched: bool = False) -> dict[str, Any]:
    """The doctor before a launch: refuse to start on any error, unless skipped (and recorded). `backend`:
    the launch's --backend (the doctor judges the run the job will run); `as_patched`: the launch applies
    the fitting patch sets first (the pipeline), so the code is judged as they will leave it."""
    if skip:
        return {"skipped": True}
    code, document = doctor_call(conn, host, run, backend, as_patched)
    if code == 2:
        raise BadInput(local_config_name(f"{document.get('error')}", run))
    if not document.get("ok"):
        render_findings(document, f"doctor refused the launch on {host.name}", only_problems=True)
        errors = [finding for finding in document.get("findings", []) if finding["result"] == "error"]
        raise AgentError(f"doctor found {len(errors)} error(s) on {host.name}; fix them or pass --skip-doctor")
    return {"skipped": False, "ok": True, "timing_s": document.get("timing_s")}


def render_epochs(epochs: list[dict[str, Any]]) -> None:
    if not epochs:
        return
    from remote import render

    out = render.console()
    accepted = any(row.get("acceptance") for row in epochs)
    view = render.table("training", ["epoch", "steps", "train loss", "val loss", "val acc@0", "tokens/s",
                                     *(["acc. length"] if accepted else [])])
    for row in epochs:
        val = row.get("val") or {}
        view.add_row(str(row["epoch"]), str(row.get("steps")), number_text(row.get("train", {}).get("loss")),
                     number_text(val.get("loss")), number_text(val.get("full_acc_0")),
                     number_text(row.get("tokens_per_s"), 0),
                     *([number_text((row.get("acceptance") or {}).get("mean_acceptance_length"))] if accepted else []))
    out.print(view)


def number_text(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
