"""The pipeline's train step with what runs around speculators' trainer: the parity gate before anything
trains (the parity room) and the acceptance after every epoch (the evaluation room). Here, beside the
rooms, because the training room imports neither (they read the training's checkpoints)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specops.pipeline.run import Run
    from specops.pipeline.run.context import StepContext


def train_hooks(run: Run) -> dict[str, Any]:
    from specops.pipeline.evaluation.epochs import epoch_scorer
    from specops.pipeline.parity import before_training

    return {"gate": lambda plan, gpus: before_training(run, plan, gpus), "scorer": lambda: epoch_scorer(run)}


def pipeline_step(context: StepContext) -> dict[str, Any]:
    from specops.pipeline.training import train_pipeline_step

    return train_pipeline_step(context, **train_hooks(context.run))
