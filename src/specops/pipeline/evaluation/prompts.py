"""The held-out prompts evaluation reads: their token ids, and what those are a function of (read without a
tokenizer, so a re-run decides to skip quickly). Shared by the evaluate step and the per-epoch scorer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput

if TYPE_CHECKING:
    from specops.pipeline.run import Run


def heldout_token_ids(run: Run, limit: int | None) -> list[list[int]]:
    from specops.pipeline.data import heldout, load_tokenizer, render_ids

    rows = heldout.read_prompts(run.paths.heldout)
    if not rows:
        raise BadInput(f"{run.label}: evaluate.heldout_prompts: no held-out prompts in {run.paths.heldout}; "
                       "set it > 0 and run prepare again")
    tokenizer = load_tokenizer(run)
    rows = rows[:limit] if limit else rows
    return [render_ids(tokenizer, row["messages"], generation_prompt=True) for row in rows]


# render_ids lives here: its code is part of what the prompts' token ids are a function of
RENDER_SOURCE = Path(__file__).resolve().parents[1] / "data" / "preparation.py"


def prompt_source(run: Run, limit: int | None) -> dict[str, Any]:
    """What the held-out prompts' token ids are a function of, read without loading a tokenizer:
    the prompts file, the tokenizer's files (and a remote-code tokenizer's code), the limit, our
    rendering code and the installed versions. Equal sources give equal token ids."""
    from specops.pipeline.data import heldout
    from specops.pipeline.run import file_digest, package_versions, tokenizer_digest

    prompts_file = run.paths.heldout / heldout.PROMPTS_FILE
    return {"prompts_file": file_digest(prompts_file) if prompts_file.is_file() else None,
            "tokenizer": tokenizer_digest(run.model_path), "limit": limit,
            "remote_code": ({path.name: file_digest(path) for path in sorted(run.model_path.glob("*.py"))}
                            if run.config.trust_remote_code else None),
            "render": file_digest(RENDER_SOURCE), "versions": package_versions()}
