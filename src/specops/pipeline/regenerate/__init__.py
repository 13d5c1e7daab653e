"""Step `regenerate`: the target answers the source conversations' prompts itself (before prepare)."""

from specops.pipeline.regenerate.step import pipeline_step, regenerate

__all__ = ["pipeline_step", "regenerate"]
