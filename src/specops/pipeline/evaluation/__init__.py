"""Step `evaluate`: the draft's acceptance when it speculates for the target, on held-out prompts."""

from specops.pipeline.evaluation.benchmarks import checked_sets, chosen_sets, target_alone_on_sets
from specops.pipeline.evaluation.compare import compare, parse_compare
from specops.pipeline.evaluation.drafts import choose_checkpoint
from specops.pipeline.evaluation.epochs import epoch_scorer
from specops.pipeline.evaluation.kinds import replay_drafts, vllm_only
from specops.pipeline.evaluation.sets import parse_pairs
from specops.pipeline.evaluation.step import evaluate, pipeline_step, recorded_backend, reproduce
from specops.pipeline.evaluation.sweep import parse_counts, parse_sweep, sweep

__all__ = [
    "checked_sets", "choose_checkpoint", "chosen_sets", "compare", "epoch_scorer", "evaluate", "parse_compare",
    "parse_counts", "parse_pairs", "parse_sweep", "pipeline_step", "recorded_backend", "replay_drafts", "reproduce",
    "sweep", "target_alone_on_sets", "vllm_only",
]
