"""`python -m specops pipeline --run NAME`: every step of a run, in order, on this host.

embedded model (if any) -> doctor -> patches for this host (apply + verify) -> prepare -> extract ->
validate -> vocab -> train -> metrics. Each step skips itself when its inputs are unchanged (the
manifest decides), so a second pipeline is quick; the first failing step stops the pipeline with
its reason. Progress goes to stderr (the job log); the summary is the one JSON document on stdout.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specops.errors import BadInput, CheckFailed

STEPS = ("doctor", "patches", "regenerate", "prepare", "extract", "validate", "vocab", "train", "evaluate", "metrics")


def say(message: str) -> None:
    print(f"specops: {message}", file=sys.stderr, flush=True)


def _doctor(run_name: str) -> dict[str, Any]:
    from specops.doctor import diagnose
    from specops.pipeline.preflight import run_settings

    document = diagnose(run=run_settings(run_name))
    errors = [finding for finding in document["findings"] if finding["result"] == "error"]
    for finding in errors:
        say(f"doctor error: {finding['check']}: {finding['where']}: {finding['why']} (fix: {finding['fix']})")
    if errors:
        raise CheckFailed(f"doctor found {len(errors)} error(s); fix them or pass --skip-doctor")
    return {"status": "ok", "findings": len(document["findings"]), "timing_s": document.get("timing_s")}


def _patches() -> dict[str, Any]:
    """Apply and verify the patch sets that fit this host (e.g. the CPU training shims on CPU hosts)."""
    from specops.patching import apply_sets, verify_sets

    applied = apply_sets()
    for entry in applied["sets"]:
        if entry.get("applicable"):
            say(f"patch set {entry['name']}: {entry.get('result')} — {entry.get('detail')}")
    if not applied["ok"]:
        raise CheckFailed("applying patch sets failed: " + "; ".join(
            entry.get("detail", "") for entry in applied["sets"] if not entry.get("ok")))
    verified = verify_sets()
    failing = [check for check in verified.get("checks", []) if not check["ok"]]
    if failing:
        raise CheckFailed("patch verify failed: " + "; ".join(f"{c.get('check')}: {c.get('detail')}" for c in failing))
    sets = [entry["name"] for entry in applied["sets"] if entry.get("applicable")]
    return {"status": "ok", "sets": sets, "checks": len(verified.get("checks", []))}


def _hidden_state_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.glob("hs_*.safetensors"))


def run_pipeline(run_name: str, samples: int | None, skip_doctor: bool, skip_patches: bool,
                 backend: str | None) -> tuple[int, dict[str, Any]]:
    from specops.pipeline import extraction
    from specops.pipeline.data import open_run

    run = open_run(run_name)
    chosen_backend = extraction.backend_for(run, backend)
    results: dict[str, Any] = {}
    summary: dict[str, Any] = {"run": run_name, "backend": chosen_backend.name, "steps": results}
    started_all = time.perf_counter()

    def step(name: str, action: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        say(f"== {name}")
        started = time.perf_counter()
        try:
            report = action()
        except (BadInput, CheckFailed) as exc:
            results[name] = {"status": "failed", "error": str(exc), "seconds": round(time.perf_counter() - started, 2)}
            say(f"{name} failed: {exc}")
            raise
        status = report.get("status", "done")
        results[name] = {"status": status, "seconds": round(time.perf_counter() - started, 2)}
        say(f"{name}: {status} in {results[name]['seconds']} s")
        return report

    try:
        if skip_doctor:
            results["doctor"] = {"status": "skipped: --skip-doctor"}
        else:
            step("doctor", lambda: _doctor(run_name))
        if skip_patches:
            results["patches"] = {"status": "skipped: --skip-patches"}
        else:
            step("patches", _patches)
        if run.config.regenerate.enabled:
            step("regenerate", lambda: _regenerate(run, chosen_backend.name, samples))
        prepared = step("prepare", lambda: _prepare(run, samples))
        extracted = step("extract", lambda: chosen_backend.extract(run, samples, extraction.Options()))
        validated = step("validate", lambda: _validate(run))
        vocab = step("vocab", lambda: _vocab(run))
        trained = step("train", lambda: _train(run))
        evaluated = (step("evaluate", lambda: _evaluate(run, chosen_backend.name)) if run.config.evaluate.enabled
                     else None)
    except (BadInput, CheckFailed) as exc:
        summary.update(ok=False, error=str(exc), failed_step=next(
            (name for name, result in results.items() if result.get("status") == "failed"), None))
        summary["seconds"] = round(time.perf_counter() - started_all, 2)
        return (2 if isinstance(exc, BadInput) else 1), summary
    metrics = trained.get("metrics") or []
    losses = [row["train"]["loss"] for row in metrics if row.get("train", {}).get("loss") is not None]
    summary.update(
        ok=True,
        samples=extracted.get("counts", {}).get("samples"),
        tokens=prepared.get("counts", {}).get("tokens"),
        loss_tokens=prepared.get("counts", {}).get("loss_tokens"),
        hidden_state_bytes=_hidden_state_bytes(run.paths.hidden_states),
        fidelity=validated.get("checks", {}).get("fidelity", {}).get("detail", {}).get("agreement"),
        coverage=vocab.get("coverage"),
        loss_first=losses[0] if losses else None,
        loss_last=losses[-1] if losses else None,
        epochs=metrics,
        checkpoints=str(run.paths.checkpoints),
        plot=trained.get("plot"),
        resume=trained.get("resume"),
        evaluation=_evaluation_summary(evaluated),
        seconds=round(time.perf_counter() - started_all, 2),
    )
    return 0, summary


def _regenerate(run: Any, backend: str, samples: int | None) -> dict[str, Any]:
    from specops.pipeline.regenerate.step import regenerate

    # as many answers as prepare's N rows need (N: --samples, else the run's `samples`, else all)
    return regenerate(run, run.config.regenerate.backend or backend,
                      samples=samples if samples is not None else run.config.samples)


def _evaluate(run: Any, backend: str) -> dict[str, Any]:
    from specops.pipeline.evaluation.step import evaluate

    return evaluate(run, backend=run.config.evaluate.backend or backend)


def _evaluation_summary(evaluated: dict[str, Any] | None) -> dict[str, Any] | None:
    if not evaluated:
        return None
    return {key: evaluated.get(key) for key in ("report", "untrained", "previous", "plot", "best")}


def _prepare(run: Any, samples: int | None) -> dict[str, Any]:
    from specops.pipeline.data import prepare

    return prepare(run, samples, False)


def _validate(run: Any) -> dict[str, Any]:
    from specops.pipeline.validation import validate

    report = validate(run, 4, skip_unchanged=True)
    if not report["ok"]:
        raise CheckFailed("validation failed: " + "; ".join(
            f"{name}: {check.get('detail')}" for name, check in report["checks"].items() if not check["ok"]))
    return report


def _vocab(run: Any) -> dict[str, Any]:
    from specops.pipeline.training import vocab_step

    return vocab_step(run)


def _train(run: Any) -> dict[str, Any]:
    from specops import gpus
    from specops.pipeline.training import train_step

    # On a GPU host the run's extraction server holds most of each GPU's memory (vLLM's
    # gpu_memory_utilization): the trainer needs it back. On CPU it is left for the next extract.
    stopped = None
    if gpus.device_count() > 0:
        from specops.pipeline.vllm import stop_running

        stopped = stop_running(run, "the pipeline's training needs the GPUs")
    _code, document = train_step(run, fresh=False, epochs=None, gpus=None, dry_run=False, **train_hooks(run))
    return {**document, **({"stopped_server": stopped} if stopped else {})}


def train_hooks(run: Any) -> dict[str, Any]:
    """What the train step runs around speculators' trainer: the parity gate before anything trains (the
    parity room) and the acceptance after every epoch (the evaluation room)."""
    from specops.pipeline.evaluation.epochs import epoch_scorer
    from specops.pipeline.parity import before_training

    return {"gate": lambda plan, gpus: before_training(run, plan, gpus), "scorer": lambda: epoch_scorer(run)}
