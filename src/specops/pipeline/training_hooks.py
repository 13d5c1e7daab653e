"""The pipeline's train step with what runs around speculators' trainer: the parity gate before anything
trains (the parity room), the acceptance after every epoch (the evaluation room) and the plan's placement
of an online run's server and trainer (pipeline.plan). Here, beside the
rooms, because the training room imports neither (they read the training's checkpoints)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specops.pipeline.run import EffectiveSettings, Run, StepContext, StepReport


def train_hooks(run: Run, settings: EffectiveSettings) -> dict[str, Any]:
    """gate, scorer, and for an online or hybrid run the plan's placement of its server and trainer on
    this host's GPUs (`planned`; a mode that does not fit is refused here, one line, exit 2). `settings`: the
    run's effective settings (made where the engine was entered, the pipeline or `step train`)."""
    from specops.pipeline.evaluation import epoch_scorer
    from specops.pipeline.parity import before_training
    from specops.pipeline.plan import planned_placement

    return {"gate": lambda plan, gpus: before_training(run, plan, settings), "scorer": lambda: epoch_scorer(run),
            "planned": planned_placement(run)}


def pipeline_step(context: StepContext) -> StepReport:
    """The pipeline's train; its figures: the losses, the epochs' rows, the plot, where it resumed and saved."""
    from specops.pipeline.training import train_pipeline_step

    report = train_pipeline_step(context, **train_hooks(context.run, context.settings))
    metrics = report.get("metrics") or []
    losses = [row["train"]["loss"] for row in metrics if row.get("train", {}).get("loss") is not None]
    return {**report, "figures": {"loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses
                                  else None, "epochs": metrics, "plot": report.get("plot"),
                                  "resume": report.get("resume"), "saved_on": report.get("saved_on"),
                                  "synced": report.get("synced_before"), "roles": report.get("roles")}}
