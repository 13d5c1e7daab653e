"""`python -m specops pipeline --run NAME`: every step of a run, in the step table's order, on this host;
with `--nodes K --node-rank I --rendezvous HOST0:PORT`, this host's node of a run across K hosts.

The order, the scopes and when a step is on come from the step table (specops.steps); each step's own
room does the work (`pipeline_step(context)`). Each step skips itself when its inputs are unchanged
(the manifest decides), so a second pipeline is quick; the first failing step stops the pipeline
with its reason, on every host. Progress goes to stderr (the job log); the summary is the one JSON
document on stdout. The doctor is not a step: the control side runs it on every host before it
launches anything (a run the doctor refuses leaves no job behind).
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.errors import BadInput, CheckFailed
from specops.steps import STEPS, Scope, Step, enabled

if TYPE_CHECKING:
    from specops.pipeline.run import Hosts, StepContext


def say(message: str) -> None:
    print(f"specops: {message}", file=sys.stderr, flush=True)


def runs_here(entry: Step, context: StepContext) -> str | None:
    """None when this host runs the step; else which host does."""
    hosts = context.hosts
    if entry.scope == Scope.FIRST_HOST and hosts.rank != 0:
        return hosts.names[0]
    if entry.scope == Scope.SAVER:
        saver = int((context.reports.get("train") or {}).get("saver", 0))
        if saver != hosts.rank:
            return hosts.names[saver]
    return None


def call(entry: Step, context: StepContext) -> dict[str, Any]:
    module, _, function = entry.runs.partition(":")
    return getattr(importlib.import_module(module), function)(context)


def run_pipeline(run_name: str, samples: int | None, skip: frozenset[str], backend: str | None,
                 hosts: Hosts | None = None) -> tuple[int, dict[str, Any]]:
    from specops.pipeline import extraction
    from specops.pipeline.data import open_run
    from specops.pipeline.run import OneHost, StepContext

    run = open_run(run_name)
    context = StepContext(run, run.samples_for(samples), extraction.backend_for(run, backend).name,
                          hosts or OneHost())
    hosts = context.hosts
    results: dict[str, Any] = {}
    summary: dict[str, Any] = {"run": run_name, "backend": context.backend, "steps": results}
    if hosts.count > 1:
        summary.update(hosts=hosts.names, host=context.name, node_rank=hosts.rank)
    started_all = time.perf_counter()
    try:
        for entry in STEPS:
            if entry.name in skip:
                results[entry.name] = {"status": f"skipped: --skip-{entry.name}"}
                continue
            if not enabled(entry, run.config):
                continue
            elsewhere = runs_here(entry, context)
            say(f"== {entry.name}" + (f" (on {elsewhere})" if elsewhere else ""))
            started = time.perf_counter()
            if elsewhere:
                results[entry.name] = {"status": f"on {elsewhere}"}
            else:
                try:
                    context.reports[entry.name] = report = call(entry, context)
                except (BadInput, CheckFailed) as exc:
                    results[entry.name] = {"status": "failed", "error": str(exc),
                                           "seconds": round(time.perf_counter() - started, 2)}
                    say(f"{entry.name} failed: {exc}")
                    raise
                results[entry.name] = {"status": report.get("status", "done"),
                                       "seconds": round(time.perf_counter() - started, 2)}
            hosts.barrier(entry.name)
            say(f"{entry.name}: {results[entry.name]['status']} in {round(time.perf_counter() - started, 2)} s")
    except Exception as exc:
        fail = getattr(hosts, "fail", None)
        if fail is not None:  # the other hosts stop at their next wait, naming this one
            fail(str(exc) if isinstance(exc, BadInput | CheckFailed) else f"{type(exc).__name__}: {exc}")
        if not isinstance(exc, BadInput | CheckFailed):
            raise
        summary.update(ok=False, error=str(exc), failed_step=next(
            (name for name, result in results.items() if result.get("status") == "failed"), None))
        summary["seconds"] = round(time.perf_counter() - started_all, 2)
        return (2 if isinstance(exc, BadInput) else 1), summary
    shown = figures(context)
    if hosts.count > 1:  # what a step shows where it ran (validate on the first host, evaluate on the saver)
        gathered = hosts.all_gather("summary", {"steps": {name: result["status"] for name, result in results.items()},
                                                "figures": shown})
        summary["on_hosts"] = {name: entry["steps"] for name, entry in zip(hosts.names, gathered, strict=True)}
        for key, value in shown.items():
            if value is None:
                shown[key] = next((entry["figures"][key] for entry in gathered if entry["figures"][key] is not None),
                                  None)
    summary.update(ok=True, **shown, seconds=round(time.perf_counter() - started_all, 2))
    return 0, summary


def figures(context: StepContext) -> dict[str, Any]:
    """What the summary shows of the steps' reports (a step this host did not run shows nothing)."""
    reports = context.reports
    prepared, extracted = reports.get("prepare") or {}, reports.get("extract") or {}
    trained = reports.get("train") or {}
    metrics = trained.get("metrics") or []
    losses = [row["train"]["loss"] for row in metrics if row.get("train", {}).get("loss") is not None]
    evaluated = reports.get("evaluate")
    return {
        "samples": extracted.get("counts", {}).get("samples"),
        "tokens": prepared.get("counts", {}).get("tokens"),
        "loss_tokens": prepared.get("counts", {}).get("loss_tokens"),
        "hidden_state_bytes": hidden_state_bytes(context.run.paths.hidden_states),
        "fidelity": (reports.get("validate") or {}).get("checks", {}).get("fidelity", {}).get("detail", {}).get(
            "agreement"),
        "coverage": (reports.get("vocab") or {}).get("coverage"),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "epochs": metrics,
        "checkpoints": str(context.run.paths.checkpoints),
        "plot": trained.get("plot"),
        "resume": trained.get("resume"),
        "saved_on": trained.get("saved_on"),
        "regenerate": shares_of(reports.get("regenerate")),
        "extract": shares_of(extracted),
        "evaluation": {key: evaluated.get(key) for key in ("report", "untrained", "previous", "plot", "best")}
        if evaluated else None,
    }


def shares_of(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """A step's share and exchange across hosts (None on one host)."""
    if not report or "exchanged" not in report:
        return None
    keys = ("part", "share_status", "written", "shares", "exchanged")
    return {key: report[key] for key in keys if key in report}


def hidden_state_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.glob("hs_*.safetensors"))
