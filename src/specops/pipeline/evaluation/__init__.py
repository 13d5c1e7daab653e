"""Step `evaluate`: the draft's acceptance when it speculates for the target, on held-out prompts."""

from specops.pipeline.evaluation.drafts import choose_checkpoint
from specops.pipeline.evaluation.epochs import epoch_scorer
from specops.pipeline.evaluation.step import evaluate, pipeline_step

__all__ = ["choose_checkpoint", "epoch_scorer", "evaluate", "pipeline_step"]
