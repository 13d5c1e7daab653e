"""The prompts regenerate answers: the run's conversations, cleaned, held-out ones left out.

Written to <run>/regenerated/source.jsonl, one row per usable conversation in file order:
{"id", "line", "messages"}. `id` is a stable content id (what speculators' `--resume` keys on when
a row has one); malformed lines and duplicates never reach a backend (speculators' JSON loader
would stop at the first malformed line). Both backends read this very file, so they answer the
same prompts in the same order.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, TypedDict

from specops.contract.errors import BadInput
from specops.host import atomic
from specops.pipeline.data import Conversation, Malformed, heldout, read_conversations, regenerated

if TYPE_CHECKING:
    from specops.pipeline.run import Run

SOURCE_FILE = regenerated.SOURCE_FILE
read_source = regenerated.read_source


class MalformedLine(TypedDict):
    line: int
    reason: str


class SourceCounts(TypedDict):
    """What building source.jsonl kept and left out (held-out prompts, duplicates, malformed lines)."""

    conversations: int
    held_out: int
    duplicates: int
    without_user_turn: int
    malformed: list[MalformedLine]


def build_source(run: Run) -> SourceCounts:
    """Write source.jsonl for the run; returns counts and the malformed lines."""
    data_path = run.paths.resolve(run.config.data)
    records = list(read_conversations(run.config.data, data_path))
    conversations = [r for r in records if isinstance(r, Conversation)]
    malformed = [{"line": r.line, "reason": r.reason} for r in records if isinstance(r, Malformed)]
    held = heldout.choose(conversations, run.config.evaluate.heldout_prompts)
    rows, seen, duplicates, no_user = [], set(), 0, 0
    for conversation in conversations:
        key = heldout.content_key(conversation.messages)
        if key in held:
            continue
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        if heldout.first_prompt(conversation.messages) is None:
            no_user += 1
            continue
        rows.append({"id": f"c{key[:20]}", "line": conversation.line, "messages": conversation.messages})
    if not rows:
        raise BadInput(f"{data_path}: no conversation with a user turn to regenerate")
    text = "".join(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n" for row in rows)
    atomic.write_text(run.paths.regenerated / SOURCE_FILE, text)
    return SourceCounts(conversations=len(rows), held_out=len(held), duplicates=duplicates,
                        without_user_turn=no_user, malformed=malformed)


def prompt_turns(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The turns that drive regeneration, as speculators reads them: system and user, answers dropped."""
    return [{"role": m["role"], "content": m["content"]} for m in messages
            if m["role"] in ("system", "user") and m["content"]]
