"""loss.png: the draft's training loss per step and its validation loss per epoch, with the epochs
marked, a legend and axis units; written next to the checkpoints (fetched home with them)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from specops.host.atomic import write_bytes
from specops.pipeline.training.metrics import TrainingLog, loss_per_step

PLOT_FILE = "loss.png"
X_LABEL = "global step (optimizer steps)"
Y_LABEL = "loss (cross-entropy, nats)"
TRAIN_SERIES = "train loss (per step)"
VAL_SERIES = "validation loss (per epoch, at its last step)"
ACCEPTANCE_SERIES = "mean acceptance length (held-out prompts, per epoch; right axis)"
ACCEPTANCE_LABEL = "mean acceptance length"


def _epoch_layout(log: TrainingLog) -> tuple[list[tuple[int, int]], list[tuple[int, float]]]:
    """Where each epoch starts (epoch, first step) and the validation loss at each epoch's last step."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for step in log.steps:
        first[step.epoch] = min(first.get(step.epoch, step.global_step), step.global_step)
        last[step.epoch] = max(last.get(step.epoch, step.global_step), step.global_step)
    starts = sorted((epoch, step) for epoch, step in first.items() if epoch >= 0)
    validation = [(last[item.epoch], item.metrics["loss"]) for item in log.validations
                  if item.epoch in last and "loss" in item.metrics]
    return starts, validation


def plot_loss(log: TrainingLog, path: Path, run: str = "",
              acceptance: dict[int, float] | None = None) -> dict[str, Any] | None:
    """Draw the plot to `path` atomically and say what it shows; None (nothing written) without steps.

    acceptance: {epoch: mean acceptance length} measured after each epoch, drawn on a right axis."""
    points = loss_per_step(log)
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")  # hosts have no display
    from matplotlib import pyplot

    starts, validation = _epoch_layout(log)
    title = f"run {run}: draft training" if run else "draft training"
    figure, axes = pyplot.subplots(figsize=(9, 4.8), dpi=100)
    try:
        steps, losses = zip(*points, strict=True)
        axes.plot(steps, losses, linewidth=1.2, label=TRAIN_SERIES)
        if validation:
            val_steps, val_losses = zip(*validation, strict=True)
            axes.plot(val_steps, val_losses, marker="o", linewidth=1.5, label=VAL_SERIES)
        for index, (epoch, step) in enumerate(starts):
            axes.axvline(step, color="grey", linestyle=":", linewidth=0.8,
                         label="epoch start" if index == 0 else None)
            axes.annotate(f"epoch {epoch}", (step, 1.0), xycoords=("data", "axes fraction"),
                          xytext=(2, -10), textcoords="offset points", fontsize=7, color="grey")
        last = {step.epoch: step.global_step for step in log.steps}
        accepted = sorted((last[epoch], length) for epoch, length in (acceptance or {}).items() if epoch in last)
        handles, labels = axes.get_legend_handles_labels()
        if accepted:
            right = axes.twinx()
            acc_steps, lengths = zip(*accepted, strict=True)
            right.plot(acc_steps, lengths, marker="s", color="tab:green", linewidth=1.5, label=ACCEPTANCE_SERIES)
            right.set_ylabel(ACCEPTANCE_LABEL)
            more = right.get_legend_handles_labels()
            handles, labels = handles + more[0], labels + more[1]
        axes.set_xlabel(X_LABEL)
        axes.set_ylabel(Y_LABEL)
        axes.set_title(title)
        axes.grid(alpha=0.3)
        axes.legend(handles, labels, loc="best")
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", bbox_inches="tight")
    finally:
        pyplot.close(figure)
    write_bytes(path, buffer.getvalue())
    return {"path": str(path), "title": title, "x_label": X_LABEL, "y_label": Y_LABEL,
            "series": [TRAIN_SERIES, *([VAL_SERIES] if validation else []), *([ACCEPTANCE_SERIES] if accepted else [])],
            "train_points": len(points), "validation_points": validation, "acceptance_points": accepted,
            "epoch_marks": [{"epoch": epoch, "step": step} for epoch, step in starts]}
