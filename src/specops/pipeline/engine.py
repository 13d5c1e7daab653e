"""`python -m specops pipeline --run NAME`: every step of a run, in the step table's order, on this host;
with `--hosts A,B --node-rank I --rendezvous HOST0:PORT --group ID`, this host's node of a run across them.

The order, the scopes and when a step is on come from the step table (specops.contract.step_table); each step's own
room does the work (`pipeline_step(context)`, imported by `step_functions`). Each step skips itself when
its inputs are unchanged (the manifest decides), so a second pipeline is quick; the first failing step
stops the pipeline with its reason, on every host. A step's report declares what the summary shows of it
(`figures`, named in its row). Progress goes to stderr (the job log); the summary is the one JSON
document on stdout. The doctor is not a step: the control side runs it on every host before it
launches anything (a run the doctor refuses leaves no job behind).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput, CheckFailed
from specops.contract.progress import say
from specops.contract.step_table import STEPS, Scope, Step, enabled, step

if TYPE_CHECKING:
    from specops.pipeline.hosts import TorchrunNode
    from specops.pipeline.run import EffectiveSettings, Figures, Hosts, Run, StepContext, StepReport

StepFunction = Callable[["StepContext"], "StepReport"]


def step_functions() -> dict[str, StepFunction]:
    """Each step's function in its own room, by the table's names (imported when the pipeline runs)."""
    from specops.pipeline import data, evaluation, extraction, patches, regenerate, training, training_hooks, validation

    return {"patches": patches.pipeline_step, "regenerate": regenerate.pipeline_step, "prepare": data.pipeline_step,
            "extract": extraction.pipeline_step, "validate": validation.pipeline_step,
            "vocab": training.vocab_pipeline_step, "train": training_hooks.pipeline_step,
            "evaluate": evaluation.pipeline_step}


def runs_here(entry: Step, context: StepContext) -> str | None:
    """None when this host runs the step; else which host does."""
    hosts = context.hosts
    if entry.scope == Scope.FIRST_HOST and hosts.rank != 0:
        return hosts.names[0]
    if entry.scope == Scope.SAVER:  # the host an earlier step's report names as the one that saved
        saver = next((int(report["saver"]) for report in reversed(context.reports.values()) if "saver" in report), 0)
        if saver != hosts.rank:
            return hosts.names[saver]
    return None


def reads_of(name: str) -> list[Step]:
    """The recorded steps `name` reads, directly or through another, in the table's order."""
    needed, stack = set(), [name]
    while stack:
        for read in step(stack.pop()).reads:
            if read not in needed:
                needed.add(read)
                stack.append(read)
    return [entry for entry in STEPS if entry.name in needed]


def context_for(run: Run, samples: int | None, settings: EffectiveSettings, hosts: Hosts,
                training: TorchrunNode | None = None) -> StepContext:
    """The context every step of this invocation reads: --samples with the run's default applied here,
    once (Run.samples_for); no room applies it again."""
    from specops.pipeline.run import StepContext

    return StepContext(run, run.samples_for(samples), settings, hosts, training=training)


def enter(run: Run, samples: int | None = None, *, hosts: Hosts | None = None,
          training: TorchrunNode | None = None, **flags: str | None) -> StepContext:
    """The engine's one entry (the pipeline, `step X`, `run check`, the doctor's run): the run's effective
    settings made ONCE, from the run config and the command line (`flags`: backend, regenerate, evaluate,
    serve_python; pipeline.run.resolve), as vLLM's `EngineArgs.create_engine_config()` is made once at its
    entry, and handed down in the context; nothing below re-resolves them."""
    from specops.pipeline.run import OneHost, resolve

    return context_for(run, samples, resolve(run, **flags), hosts or OneHost(), training)


def run_step(name: str, context: StepContext, work: StepFunction, *, reads: bool = False) -> StepReport:
    """`step NAME`: the engine for the table up to NAME on one host (K = 1): with `reads` (prepare, extract),
    the steps NAME reads that the run turns on first, each by its room's function as the pipeline runs it
    (each skipped when unchanged; their reports in the context), then NAME's own work with its command's
    flags (`work`, a function of the same context). Steps before NAME that it does not read are not run.
    Returns NAME's report with the settings it ran with (`settings`, as the pipeline's summary shows them)
    and, where the run served, what became of its server (`vllm_servers`: the loads, stopped or kept).
    However the step ends, the run's server ends with it unless vllm.keep_server keeps it (vllm.serving)."""
    from specops.pipeline import vllm

    with vllm.serving(context.run, f"step {name}") as servers:
        if reads:
            context.reading_for = name
            functions = step_functions()
            for entry in reads_of(name):
                if enabled(entry, context.run.config):
                    context.reports[entry.name] = functions[entry.name](context)
            context.reading_for = None
        context.reports[name] = report = work(context)
    served = servers["starts"] or servers["stopped"] or servers.get("stays")
    return {**report, "settings": context.settings.describe(), **({"vllm_servers": servers} if served else {})}


def run_pipeline(run_name: str, samples: int | None, skip: frozenset[str], backend: str | None,
                 hosts: Hosts | None = None, training: TorchrunNode | None = None, *, only: str | None = None,
                 epochs: int | None = None, fresh: bool = False,
                 train_hosts: list[str] | None = None) -> tuple[int, dict[str, Any]]:
    """The table's steps in order; `only`: the engine entered with that one step (`invoke train --hosts`:
    the train step on every host, its inputs already there), `epochs` and `fresh` for its training;
    `train_hosts`: a role split, these hosts train and the others serve (pipeline.training.roles)."""
    from specops.pipeline.data import open_run

    run = open_run(run_name)
    context = enter(run, samples, hosts=hosts, training=training, backend=backend)
    settings = context.settings  # once: every step, the gate and the summary read it
    context.epochs, context.fresh = epochs, fresh
    if train_hosts:
        context.train_ranks = tuple(context.hosts.names.index(name) for name in train_hosts)
    hosts = context.hosts
    results: dict[str, Any] = {}
    summary: dict[str, Any] = {"run": run_name, "backend": context.backend, "settings": settings.describe(),
                               "steps": results}
    for note in settings.notes:  # what the resolution changed (a fallback), one line each
        say(note)
    if hosts.count > 1:
        summary.update(hosts=hosts.names, host=context.name, node_rank=hosts.rank)
    started_all = time.perf_counter()
    from specops.host.gpus import device_count
    from specops.host.paths import workdir
    from specops.pipeline import vllm
    from specops.pipeline.plan import later_needs

    # held: one line, no step
    vllm.check_before_run(run, context.backend, workdir(), rank=context.hosts.rank,
                          later=later_needs(run, device_count(), context.backend))
    # however the pipeline ends, its last server ends with it unless the run keeps it (vllm.serving)
    with vllm.serving(run, "the run's last step") as servers:
        summary["servers"] = servers  # filled when the work ends, before the summary is emitted
        return _run_steps(context, order_of(only), skip, summary, results, started_all)


def order_of(only: str | None) -> list[Step]:
    return [step(only)] if only else list(STEPS)


def _run_steps(context: StepContext, order: list[Step], skip: frozenset[str], summary: dict[str, Any],
               results: dict[str, Any], started_all: float) -> tuple[int, dict[str, Any]]:
    from specops.pipeline import vllm

    run, settings, hosts, functions = context.run, context.settings, context.hosts, step_functions()
    try:
        from specops.pipeline import parity

        # a draft the run asks vLLM to serve and this host's vLLM cannot: one line before any step loads a model
        parity.check_servable(run, settings, when="before any step")
        if context.train_ranks:  # roles from the command line, refused before a step as the run config's are
            from specops.pipeline.training import roles

            roles.refuse_unless_ready(context)
        for at, entry in enumerate(order):
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
                if entry.name == "prepare" and hosts.count == 1 and context.backend == "vllm":
                    from specops.host.gpus import device_count

                    # extract's server loads while prepare runs
                    if vllm.launch_ahead(run, device_count(), settings.regenerate_backend):
                        # and so does vocab; only steps after this one move (enumerate reads `order` as it goes)
                        order[at + 1:] = while_loading(order[at + 1:], at_hand={e.name for e in order[:at + 1]})
                try:
                    context.reports[entry.name] = report = functions[entry.name](context)
                except (BadInput, CheckFailed) as exc:
                    results[entry.name] = {"status": "failed", "error": str(exc),
                                           "seconds": round(time.perf_counter() - started, 2)}
                    say(f"{entry.name} failed: {exc}")
                    raise
                finally:  # a server used by this step is free for another run's step (vllm/sharing.py)
                    vllm.release_servers()
                results[entry.name] = {"status": report.get("status", "done"),
                                       "seconds": round(time.perf_counter() - started, 2)}
            hosts.barrier(entry.name)
            say(f"{entry.name}: {results[entry.name]['status']} in {round(time.perf_counter() - started, 2)} s")
    except Exception as exc:  # the other hosts stop at their next wait, naming this one
        hosts.fail(str(exc) if isinstance(exc, BadInput | CheckFailed) else f"{type(exc).__name__}: {exc}")
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


def while_loading(rest: list[Step], at_hand: set[str]) -> list[Step]:
    """The steps still to run, those that read only what is at hand by then (vocab: the prepared data) first:
    they run while the server launched ahead loads, instead of after extract waited for it. Only the order
    of steps that do not read each other changes (the table's `reads`), on one host (no barrier to meet)."""
    server_free = [entry for entry in rest if set(entry.reads) <= at_hand and entry.name != "extract"]
    return server_free + [entry for entry in rest if entry not in server_free]


def figures(context: StepContext) -> Figures:
    """What the summary shows: each step's declared figures from its report (None where this host did not
    run it), beside what the run's folders hold."""
    shown: Figures = {name: None for entry in STEPS for name in entry.figures}
    for entry in STEPS:
        declared = (context.reports.get(entry.name) or {}).get("figures") or {}
        unknown = sorted(set(declared) - set(entry.figures))
        if unknown:  # a room's mistake, not the user's
            raise RuntimeError(f"step {entry.name}: figures {unknown} are not in its row of the step table")
        shown.update(declared)
    paths = context.run.paths
    return {**shown, "hidden_state_bytes": hidden_state_bytes(paths.hidden_states),
            "checkpoints": str(paths.checkpoints)}


def hidden_state_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.glob("hs_*.safetensors"))
