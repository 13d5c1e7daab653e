"""The held-out prompts: a deterministic set of conversations that no training step sees.

Chosen by content, not by position: the conversations whose messages hash lowest (sha256 of their
canonical JSON) are held out, so the choice survives reordering, a different `samples` or a
regenerated dataset. Regenerate skips them (no answers are made for them), prepare writes them to
<run>/heldout/prompts.jsonl and keeps them out of the training rows, and evaluation reads only them.
A held-out prompt is the conversation up to its first user turn (a system turn before it included).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from specops.host import atomic
from specops.pipeline.data.conversations import Conversation

PROMPTS_FILE = "prompts.jsonl"


def content_key(messages: list[dict[str, str]]) -> str:
    canonical = json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def first_prompt(messages: list[dict[str, str]]) -> list[dict[str, str]] | None:
    """The messages up to and including the first user turn; None when there is no user turn."""
    for index, message in enumerate(messages):
        if message["role"] == "user":
            return [dict(m) for m in messages[: index + 1]]
    return None


def choose(conversations: Iterable[Conversation], size: int) -> set[str]:
    """Content keys of the `size` held-out conversations (those with a user turn, lowest keys)."""
    if size <= 0:
        return set()
    keys = sorted({content_key(c.messages) for c in conversations if first_prompt(c.messages) is not None})
    return set(keys[:size])


def prompt_rows(conversations: Iterable[Conversation], keys: set[str]) -> list[dict[str, Any]]:
    """The held-out prompts' rows, in key order (the same whatever the input order): what write_prompts writes and
    read_prompts reads back, for a step that needs them before prepare has written them."""
    rows: dict[str, dict[str, Any]] = {}
    for conversation in conversations:
        key = content_key(conversation.messages)
        prompt = first_prompt(conversation.messages)
        if key in keys and prompt is not None and key not in rows:
            rows[key] = {"id": key[:16], "line": conversation.line, "messages": prompt}
    return [rows[key] for key in sorted(rows)]


def write_prompts(folder: Path, conversations: Iterable[Conversation], keys: set[str]) -> int:
    """Write the held-out prompts (prompt_rows)."""
    rows = prompt_rows(conversations, keys)
    atomic.write_text(folder / PROMPTS_FILE, "".join(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n"
                                                     for row in rows))
    return len(rows)


def read_prompts(folder: Path) -> list[dict[str, Any]]:
    path = folder / PROMPTS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
