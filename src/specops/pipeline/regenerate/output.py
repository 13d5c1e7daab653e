"""What regenerate wrote, checked before anything trusts it (both backends write the same format).

responses.jsonl holds one row per generation, responses.errors.jsonl one row per failed
conversation (speculators' names: the errors file is the outfile's stem + `.errors.jsonl`).
`tidy` makes a file that a kill -9 interrupted safe to resume: speculators appends rows with no
fsync, so the last line may be cut, and a conversation's rows are written one by one, so its
last rows may be missing; both are removed (the conversation is then answered again) before
`--resume` reads the ids it may skip.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from specops.host import atomic
from specops.pipeline.data import regenerated

if TYPE_CHECKING:
    from specops.pipeline.regenerate.source import SourceCounts
    from specops.pipeline.run import RegenerateCounts

# The file names and readers live with their reader, prepare.
RESPONSES_FILE = regenerated.RESPONSES_FILE
ERRORS_FILE = regenerated.ERRORS_FILE
read_jsonl = regenerated.read_jsonl
generation_number = regenerated.generation_number


def _complete(rows: list[dict[str, Any]], expected: int, max_tokens: int) -> bool:
    """A conversation's rows are whole: one per user turn, or stopped by speculators' truncation rule."""
    numbers = sorted(generation_number(row) for row in rows)
    if numbers != list(range(len(numbers))):
        return False
    last = max(rows, key=generation_number)
    return len(rows) == expected or len(last.get("input_ids") or []) > max_tokens


def tidy(folder: Path, expected_turns: dict[str, int], max_tokens: int) -> dict[str, int]:
    """Drop cut lines and partly written conversations from responses.jsonl (atomically)."""
    path = folder / RESPONSES_FILE
    rows, broken = read_jsonl(path)
    by_conversation: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_conversation[str(row.get("primary_id"))].append(row)
    keep_ids = {key for key, group in by_conversation.items()
                if _complete(group, expected_turns.get(key, 1), max_tokens)}
    kept = [row for row in rows if str(row.get("primary_id")) in keep_ids]
    dropped = len(rows) - len(kept)
    if broken or dropped:
        atomic.write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in kept))
    return {"cut_lines": broken, "partial_rows": dropped}


class Failure(TypedDict):
    id: str
    error: str | None


class Checked(TypedDict):
    """What `check` found in a backend's files; `problems` lists what makes them unusable."""

    rows: int
    conversations: int
    failed: int
    failed_list: list[Failure]
    empty: int
    missing: int
    missing_list: list[str]  # the first 20
    finish_reasons: dict[str, int]
    completion_tokens: int
    problems: list[str]


def check(folder: Path, source: list[dict[str, Any]]) -> Checked:
    """Counts of what the backend wrote; `problems` lists what makes the output unusable."""
    rows, broken = read_jsonl(folder / RESPONSES_FILE)
    errors, broken_errors = read_jsonl(folder / ERRORS_FILE)
    problems = []
    if broken or broken_errors:
        problems.append(f"{broken + broken_errors} lines are not JSON")
    ids = Counter(str(row.get("id")) for row in rows)
    twice = sorted(key for key, count in ids.items() if count > 1)
    if twice:
        problems.append(f"{len(twice)} rows written twice (e.g. {twice[0]})")
    known = {row["id"] for row in source}
    for row in rows:
        ids_, mask = row.get("input_ids"), row.get("loss_mask")
        if not isinstance(ids_, list) or not isinstance(mask, list) or len(ids_) != len(mask):
            problems.append(f"row {row.get('id')}: input_ids and loss_mask missing or of different lengths")
            break
        if row.get("primary_id") not in known:
            problems.append(f"row {row.get('id')}: primary_id {row.get('primary_id')!r} is not a source row")
            break
    answered = {str(row.get("primary_id")) for row in rows}
    failed_ids = {str(error.get("id")) for error in errors} - answered  # a later resume may have answered it
    empty = sum(1 for row in rows if not any(row.get("loss_mask") or []))
    failed = [{"id": key, "error": next(((e.get("metadata") or {}).get("error") for e in errors
                                          if str(e.get("id")) == key), None)} for key in sorted(failed_ids)]
    missing = sorted(known - answered - failed_ids)
    finish = Counter(str((row.get("metadata") or {}).get("finish_reason")) for row in rows)
    return Checked(rows=len(rows), conversations=len(answered), failed=len(failed), failed_list=failed,
                   empty=empty, missing=len(missing), missing_list=missing[:20],
                   finish_reasons=dict(sorted(finish.items())),
                   completion_tokens=sum(sum(row.get("loss_mask") or []) for row in rows), problems=problems)


# failures listed one line each up to this many; beyond it, one line a reason (a GPU run of ShareGPT failed 1,074
# conversations for one reason, and one line each buried the step's log)
FAILURES_EACH = 5
REASON_CHARS = 240


def failure_lines(failed: list[Failure], errors_file: Path) -> list[str]:
    """The step log's account of failed conversations: each on its own line when few, else one line a reason (its
    first error as written, the count, the first ids), most frequent first; every one stays in `errors_file`."""
    if len(failed) <= FAILURES_EACH:
        return [f"regenerate: conversation {failure['id']} failed: {failure['error']}" for failure in failed]
    groups: dict[str, list[Failure]] = {}
    for failure in failed:  # one reason: the error with its numbers left out (a prompt's length, a port)
        groups.setdefault(re.sub(r"\d+", "N", str(failure["error"])), []).append(failure)
    lines = [f"regenerate: {len(failed)} conversations failed, for {len(groups)} reason(s); each with its error in "
             f"{errors_file}"]
    for members in sorted(groups.values(), key=len, reverse=True):
        reason = str(members[0]["error"])
        reason = reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS] + "..."
        shown = ", ".join(member["id"] for member in members[:3]) + (", ..." if len(members) > 3 else "")
        lines.append(f"regenerate:   {len(members)} x {reason} ({shown})")
    return lines


def counts_of(checked: Checked, source_counts: SourceCounts) -> RegenerateCounts:
    """The step's counts for the manifest: what `check` found and what building the source left out."""
    from specops.pipeline.run import RegenerateCounts

    return RegenerateCounts(rows=checked["rows"], conversations=checked["conversations"], failed=checked["failed"],
                            empty=checked["empty"], missing=checked["missing"],
                            completion_tokens=checked["completion_tokens"], finish_reasons=checked["finish_reasons"],
                            held_out=source_counts["held_out"], source_malformed=len(source_counts["malformed"]))
