"""Regenerate's inputs: what its manifest record is made of, the same for one host and for a share of many.

The data file's digest, the target's digest (config and weights) and tokenizer, the sampling settings,
the held-out size (held-out prompts are not answered) and the backend's name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specops.pipeline.run import Run


def regenerate_inputs(run: Run, backend: str) -> dict[str, Any]:
    from specops.pipeline.run import file_digest, model_digest, tokenizer_digest

    data_path = run.paths.resolve(run.config.data)
    settings = run.config.regenerate.model_dump(mode="json")
    settings.pop("enabled")
    settings.pop("backend")
    settings.pop("server")  # which server answers: the same target, the same answers (and runs before it keep theirs)
    if backend == "vllm":
        settings.pop("seed")  # speculators takes the seed inside sampling params
    if settings["long_prompts"] == "drop":  # the default: runs answered before it existed keep their inputs
        settings.pop("long_prompts")
    if run.config.regenerate.beyond_defaults():  # the answers' length and the prompts' shortening depend on it
        settings["max_seq_len"] = run.config.max_seq_len
    return {"data": run.config.data, "data_digest": file_digest(data_path) if data_path.is_file() else None,
            "model": run.config.model, "model_digest": model_digest(run.model_path),
            "tokenizer": tokenizer_digest(run.model_path), "sampling": settings, "backend": backend,
            "heldout_prompts": run.config.evaluate.heldout_prompts, "dtype": run.config.dtype}
