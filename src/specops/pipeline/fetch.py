"""What `invoke fetch` brings home (`fetch-list --run NAME`), with sizes and hashes.

The best checkpoint (the folder vLLM loads as a speculative model: config.json and
model.safetensors with d2t/t2d inside, in speculators' format) without its optimizer and
scheduler state, plus the run's metrics table, loss plot, training log, vocab coverage report,
validation report and manifest, and the evaluation's report and acceptance plot when there are.
The metrics table is written first, so what is listed is current.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specops import atomic
from specops.errors import BadInput
from specops.pipeline.run import Run, file_sha256
from specops.pipeline.training import metrics_report

TRAINING_STATE = ("optimizer_state_dict.pt", "scheduler_state_dict.pt")


def _entry(path: Path, local_name: str) -> dict[str, Any]:
    return {"path": str(path), "name": local_name, "size": path.stat().st_size, "sha256": file_sha256(path)}


def fetch_list(run_name: str, with_training_state: bool) -> dict[str, Any]:
    run = Run(run_name)
    checkpoints = run.paths.checkpoints
    best = checkpoints / "checkpoint_best"
    if not best.exists():
        raise BadInput(f"{checkpoints}: no checkpoint_best yet for run {run_name}: train first")
    best_dir = best.resolve()
    report = metrics_report(run)
    atomic.write_json(checkpoints / "metrics.json", report)
    files = [_entry(path, f"checkpoint/{path.name}") for path in sorted(best_dir.iterdir())
             if path.is_file() and (with_training_state or path.name not in TRAINING_STATE)]
    extras = [checkpoints / "metrics.json", checkpoints / "loss.png", checkpoints / "acceptance.png",
              checkpoints / "train.log",
              run.paths.validate_report, run.paths.manifest, *sorted(run.paths.vocab.glob("*.json"))]
    files += [_entry(path, path.name) for path in extras if path.is_file()]
    evaluation = run.paths.evaluation / "report.json"
    if evaluation.is_file():
        files.append(_entry(evaluation, "evaluation.json"))
    return {"ok": True, "run": run_name, "best_epoch": best_dir.name, "files": files,
            "total_bytes": sum(entry["size"] for entry in files), "metrics": report["epochs"]}
