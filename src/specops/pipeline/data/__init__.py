"""The data room: conversations in (JSONL or a hub dataset), the prepare step (tokenised rows, loss
masks, token frequencies; the held-out prompts set aside; rows from regenerated answers), and the
embedded tiny target with its chat data."""

from specops.host.paths import workdir
from specops.pipeline.data import gguf, heldout, regenerated
from specops.pipeline.data.conversations import Conversation, Malformed, read_conversations
from specops.pipeline.data.preparation import (
    load_tokenizer,
    pipeline_step,
    prepare,
    remakes,
    render_ids,
    retired_by_prepare,
    tokenise_with_mask,
)
from specops.pipeline.data.tiny import generate as generate_tiny
from specops.pipeline.data.tiny import generate_shape, planned_config
from specops.pipeline.run import Run


def open_run(name: str, weights: bool = True) -> Run:
    """The named run, with its embedded target generated first when the run uses one (the tiny one
    in a second or so; a GPU shape in under a minute on a GPU), deterministic, and exactly what the
    run's first step would make. A GGUF target (data/gguf.py) gets its folder: its description always (what
    the doctor and the run check judge), its weights with `weights` (a model load: every step's entry, never
    the checks before a launch)."""
    run = Run(name)
    if run.config.embedded is not None:
        generate_shape(workdir(), run.config.embedded)
    gguf.ensure(run, weights)
    return run


__all__ = ["Conversation", "Malformed", "generate_shape", "generate_tiny", "gguf", "heldout", "load_tokenizer",
           "open_run", "pipeline_step", "planned_config", "prepare", "read_conversations", "regenerated", "remakes",
           "render_ids", "retired_by_prepare", "tokenise_with_mask"]
