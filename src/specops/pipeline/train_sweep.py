"""`train --sweep KEY=V1,V2 ...`: many drafts from one extraction, each scored by the run's own evaluation.

Regenerate and extract are a run's cost; a training is cheap beside them. A sweep trains every setting of the grid
of its keys' values (draft.* and train.* keys: pipeline.run.sweeps refuses the rest, naming the step a key would
make again) from the run's prepared rows, hidden states and vocabulary, one after another on this host, each into
<run>/sweeps/<setting>/checkpoints (the run's own config: the run's own checkpoints), scores each with the run's
evaluation (the held-out prompts and evaluate.sets) and names the best per set and overall, with its margin over
the runner-up. It is the engine's own train and evaluate steps (engine.step_functions) on each setting's run,
entered as `step train` enters the run (engine.enter): the parity gate, the acceptance every epoch, resume from
checkpoints and the manifest's skip all hold per setting, so a stopped sweep run again trains only what is not
finished. The document is <run>/sweeps/sweep.json.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput, CheckFailed, as_bad_input
from specops.contract.progress import speaker
from specops.host import atomic

if TYPE_CHECKING:
    from specops.pipeline.run import Run, Setting, StepContext

SWEEP_FILE = "sweep.json"
HELDOUT = "heldout"

say = speaker("train")


def check(run: Run, items: Sequence[str]) -> list[Setting]:
    """The sweep's settings read against the run, and what every setting trains from: bad input (one line, exit 2)
    before anything trains."""
    from specops.contract.values import train_sweep
    from specops.pipeline.run import Manifest, settings_of

    settings = settings_of(run, as_bad_input(train_sweep, items))
    config = run.config
    if config.hidden_states.mode != "offline":
        raise BadInput(f"{run.label}: hidden_states.mode: {config.hidden_states.mode}: a sweep trains from the run's "
                       "extracted hidden states (offline); online training would ask the server again for each setting")
    if not (config.evaluate.enabled and config.evaluate.heldout_prompts):
        raise BadInput(f"{run.label}: evaluate.enabled and evaluate.heldout_prompts: a sweep scores every setting with "
                       "the run's evaluation; turn it on (held-out prompts are set aside by prepare)")
    record = Manifest(run.paths.run_dir).record("extract") or {}
    if record.get("status") != "done":
        raise BadInput(f"{run.paths.hidden_states}: not extracted yet; a sweep never regenerates or extracts: run "
                       f"`invoke extract --run {run.paths.name}` (or the pipeline) first")
    return settings


def sweep(context: StepContext, settings: list[Setting], fresh: bool = False) -> dict[str, Any]:
    """Train and score every setting (`fresh`: each starts over); the sweep's document."""
    from specops.contract.step_table import enabled, step
    from specops.pipeline import vllm
    from specops.pipeline.engine import enter, step_functions
    from specops.pipeline.run import sync_records

    run = context.run
    started = time.time()
    # every setting's own entry first: its effective settings, and a kind this host cannot train or serve is
    # one line before any training
    contexts = [enter(setting.run_of(run)) for setting in settings]
    functions = step_functions()
    functions["vocab"](context)  # the run's own vocabulary when missing or stale (skipped when unchanged)
    rows: list[dict[str, Any]] = []
    for number, (setting, entry) in enumerate(zip(settings, contexts, strict=True), 1):
        if not setting.own:
            sync_records(run, entry.run, setting.own_vocab(run))
        entry.fresh = fresh
        say(f"setting {number}/{len(settings)}: {setting.label}" + (" (the run's own config)" if setting.own else ""))
        began = time.perf_counter()
        row: dict[str, Any] = {"label": setting.label, "values": setting.values, "own": setting.own,
                               "checkpoints": str(entry.run.paths.checkpoints)}
        try:
            trained = functions["train"](entry)
            evaluated = (functions["evaluate"](entry) if enabled(step("evaluate"), entry.run.config) else {})
        except CheckFailed as exc:  # this setting failed a check (stop_if, parity): the others still train
            row.update(status="failed", error=str(exc), seconds=round(time.perf_counter() - began, 2))
            say(f"setting {setting.label}: failed: {exc}")
            rows.append(row)
            continue
        finally:  # a server used by this setting is free for another run's step (vllm/sharing.py)
            vllm.release_servers()
        row.update(status="done", train=trained.get("status"), evaluate=evaluated.get("status"),
                   seconds=round(time.perf_counter() - began, 2), **_figures(trained, evaluated))
        rows.append(row)
    sets = list(dict.fromkeys(name for row in rows for name in row.get("sets", {})))
    document = {"run": run.paths.name, "rows": rows, "sets": sets, "best": best_of(rows, sets),
                "started_at": started, "seconds": round(time.time() - started, 2),
                "file": str(run.paths.run_dir / "sweeps" / SWEEP_FILE)}
    atomic.write_json(run.paths.run_dir / "sweeps" / SWEEP_FILE, document)
    failed = [row["label"] for row in rows if row["status"] == "failed"]
    if failed:
        document["error"] = f"{len(failed)} of {len(rows)} settings failed ({'; '.join(failed)}); see sweep.json"
    return document


def _figures(trained: dict[str, Any], evaluated: dict[str, Any]) -> dict[str, Any]:
    """What the table shows of a setting: its epochs' last loss, the checkpoint scored, per set its trained and
    untrained mean acceptance length and the trained draft's per-position acceptance."""
    metrics = trained.get("metrics") or []
    losses = [row["train"]["loss"] for row in metrics if (row.get("train") or {}).get("loss") is not None]
    report, untrained = evaluated.get("report") or {}, evaluated.get("untrained") or {}
    sets = {HELDOUT: _set(report, untrained)} if report else {}
    for name, result in (evaluated.get("sets") or {}).items():
        sets[name] = _set(result.get("trained") or {}, result.get("untrained") or {})
    return {"epochs": len(metrics), "loss_last": losses[-1] if losses else None,
            "checkpoint": report.get("checkpoint"), "sets": sets}


def _set(trained: dict[str, Any], untrained: dict[str, Any]) -> dict[str, Any]:
    return {"mean_acceptance_length": trained.get("mean_acceptance_length"),
            "per_position_acceptance": trained.get("per_position_acceptance"), "prompts": trained.get("prompts"),
            "untrained": untrained.get("mean_acceptance_length")}


def _ranked(scores: dict[str, float]) -> dict[str, Any] | None:
    """The highest of scores (ties: the earlier setting), the runner-up and the margin between them."""
    if not scores:
        return None
    order = sorted(scores, key=lambda label: -scores[label])  # sorted is stable: ties keep the sweep's order
    best, runner = order[0], order[1] if len(order) > 1 else None
    return {"label": best, "score": round(scores[best], 4), "runner_up": runner,
            "margin": round(scores[best] - scores[runner], 4) if runner is not None else None}


def best_of(rows: list[dict[str, Any]], sets: list[str]) -> dict[str, Any] | None:
    """The best setting per set (by its mean acceptance length) and overall (by the mean of its per-set lengths,
    over the sets every scored setting has), each with its margin over the runner-up; None when nothing scored."""
    per_set = {}
    for name in sets:
        scores = {row["label"]: length for row in rows if row["status"] == "done"
                  and (length := (row["sets"].get(name) or {}).get("mean_acceptance_length")) is not None}
        if (ranked := _ranked(scores)) is not None:
            per_set[name] = ranked
    scored = [row for row in rows if row["status"] == "done" and row["sets"]]
    common = [name for name in sets if all((row["sets"].get(name) or {}).get("mean_acceptance_length") is not None
                                           for row in scored)]
    overall = _ranked({row["label"]: sum(row["sets"][name]["mean_acceptance_length"] for name in common) / len(common)
                       for row in scored} if common else {})
    if overall is None:
        return None
    values = next(row["values"] for row in rows if row["label"] == overall["label"])
    return {**overall, "values": values, "by": f"the mean of its mean acceptance lengths on {', '.join(common)}",
            "per_set": per_set}
