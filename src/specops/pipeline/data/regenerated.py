"""Prepare's rows from regenerated answers: the token ids and loss mask exactly as generated.

regenerate (the room before prepare) writes <run>/regenerated/source.jsonl (the prompts, one row a
conversation) and responses.jsonl (speculators' `regenerate-responses` rows, one a generation).
The generation boundary is the mask (speculators' boundary samples): no re-rendering, so the
draft learns the very tokens the target produced. Rows come in source order, then generation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput
from specops.pipeline.data.conversations import Malformed

if TYPE_CHECKING:
    from specops.pipeline.run import Run

SOURCE_FILE = "source.jsonl"
RESPONSES_FILE = "responses.jsonl"
ERRORS_FILE = "responses.errors.jsonl"


def read_source(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / SOURCE_FILE).read_text(encoding="utf-8").split("\n")
            if line.strip()]


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """(rows that parse, lines that do not)."""
    if not path.is_file():
        return [], 0
    rows, broken = [], 0
    # split on "\n" alone: str.splitlines also breaks at U+2028, U+0085 and the like, which a JSON
    # string written with ensure_ascii=False may hold (a random target's answers do)
    for line in path.read_text(encoding="utf-8", errors="replace").split("\n"):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            broken += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            broken += 1
    return rows, broken


def generation_number(row: dict[str, Any]) -> int:
    suffix = str(row.get("id", "")).rsplit("_gen", 1)
    return int(suffix[1]) if len(suffix) == 2 and suffix[1].isdigit() else 0


def ordered_rows(folder: Path) -> list[dict[str, Any]]:
    """The rows in a canonical order (source row, then generation): vLLM's come back in any order."""
    rows, _broken = read_jsonl(folder / RESPONSES_FILE)
    return sorted(rows, key=lambda row: ((row.get("metadata") or {}).get("idx", 0), generation_number(row)))


def usable(mask: list[int], max_seq_len: int) -> bool:
    """A row prepare keeps: at least one generated token within the run's max_seq_len."""
    return any(mask[:max_seq_len])


def usable_rows(folder: Path, max_seq_len: int) -> int:
    """How many rows of responses.jsonl prepare would keep (regenerate answers until there are enough)."""
    rows, _broken = read_jsonl(folder / RESPONSES_FILE)
    return sum(1 for row in rows if usable(list(row.get("loss_mask") or []), max_seq_len))


def regenerated_rows(run: Run, samples: int | None) -> dict[str, Any]:
    """The fields of prepare's rows (input_ids, loss_mask, source_lines, skipped, truncated)."""
    folder = run.paths.regenerated
    if not (folder / RESPONSES_FILE).is_file():
        raise BadInput(f"{folder / RESPONSES_FILE}: no regenerated answers; run the regenerate step first "
                       "(step regenerate; the pipeline and step prepare/extract run it when the run enables it)")
    lines = [row["line"] for row in read_source(folder)]
    out: dict[str, Any] = {"input_ids": [], "loss_mask": [], "source_lines": [], "skipped": [], "truncated": 0}
    limit = run.config.max_seq_len
    for row in ordered_rows(folder):
        if samples is not None and len(out["input_ids"]) >= samples:
            break
        idx = (row.get("metadata") or {}).get("idx", 0)
        line = lines[idx] if 0 <= idx < len(lines) else 0
        ids, mask = list(row["input_ids"]), list(row["loss_mask"])
        if len(ids) > limit:
            ids, mask = ids[:limit], mask[:limit]
            out["truncated"] += 1
        if not usable(mask, limit):
            out["skipped"].append(Malformed(line, f"{row.get('id')}: no generated tokens within max_seq_len {limit}"))
            continue
        out["input_ids"].append(ids)
        out["loss_mask"].append(mask)
        out["source_lines"].append(line)
    return out
