"""Prepare's rows from regenerated answers: the token ids and loss mask exactly as generated.

The generation boundary is the mask (speculators' boundary samples): no re-rendering, so the
draft learns the very tokens the target produced. Rows come in source order, then generation.
"""

from __future__ import annotations

from typing import Any

from specops.errors import BadInput
from specops.pipeline.conversations import Malformed


def regenerated_rows(run: Any, samples: int | None) -> Any:
    from specops.pipeline.prepare import Prepared
    from specops.pipeline.regenerate.output import RESPONSES_FILE, ordered_rows
    from specops.pipeline.regenerate.source import read_source

    folder = run.paths.regenerated
    if not (folder / RESPONSES_FILE).is_file():
        raise BadInput(f"{folder / RESPONSES_FILE}: no regenerated answers; run the regenerate step first")
    lines = [row["line"] for row in read_source(folder)]
    out = Prepared()
    limit = run.config.max_seq_len
    for row in ordered_rows(folder):
        if samples is not None and len(out.input_ids) >= samples:
            break
        idx = (row.get("metadata") or {}).get("idx", 0)
        line = lines[idx] if 0 <= idx < len(lines) else 0
        ids, mask = list(row["input_ids"]), list(row["loss_mask"])
        if len(ids) > limit:
            ids, mask = ids[:limit], mask[:limit]
            out.truncated += 1
        if not any(mask):
            out.skipped.append(Malformed(line, f"{row.get('id')}: no generated tokens within max_seq_len {limit}"))
            continue
        out.input_ids.append(ids)
        out.loss_mask.append(mask)
        out.source_lines.append(line)
    return out
