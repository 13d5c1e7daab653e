"""The training room (steps 3 and 4): the draft vocabulary, the `speculators train` command and its
checkpoints, the steps with their manifest books, the metrics read back from the log, the loss plot."""

from specops.pipeline.training import command, metrics, plot, vocab
from specops.pipeline.training.command import TrainPlan, build_train_command
from specops.pipeline.training.step import (
    draft_vocab_size,
    metrics_report,
    train_pipeline_step,
    train_plan,
    train_step,
    vocab_pipeline_step,
    vocab_step,
)

__all__ = ["TrainPlan", "build_train_command", "command", "draft_vocab_size", "metrics", "metrics_report", "plot",
           "train_pipeline_step", "train_plan", "train_step", "vocab", "vocab_pipeline_step", "vocab_step"]
