"""The parity room: before training and before every evaluation, the draft config read the way the
installed vLLM reads it (from its source, nothing imported) against what training used: method, the
auxiliary layers extraction captured (in vLLM's numbering), vocabulary mapping sizes, norm flags, the
target's architecture; plus, where it is cheap, one real request through the serving path with the
untrained draft. A mismatch is one line naming the key and both values; exit 1."""

from specops.pipeline.parity.gate import (
    before_evaluation,
    before_training,
    check_servable,
    dry_run_draft,
    trained_with,
)
from specops.pipeline.parity.vllm_reading import VllmReading, read_vllm

__all__ = ["VllmReading", "before_evaluation", "before_training", "check_servable", "dry_run_draft", "read_vllm",
           "trained_with"]
