"""Benchmark sets: named prompt files evaluated beside the held-out prompts, as the field reports a draft.

A set is a JSONL file (`.gz` too), one conversation a line, in one of the shapes the field publishes:
MT-Bench `question.jsonl` (`turns`: every turn a prompt, each answered in context by the target's own
answer to the turn before), GSM8K (`question`), HumanEval (`prompt`), or our own conversations
(`messages` [{role, content}] or ShareGPT `conversations` [{from, value}]: their user turns, answered by
the target as MT-Bench's are; the file's own answers are not the target's). Every turn is one prompt: its
token ids are the chat template's rendering of the turns so far with the target's answers between them.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specops.contract.errors import BadInput

# the keys a line may carry its turns under, in the order they are tried
SHAPES = ("turns", "question", "prompt", "messages", "conversations")
USER_ROLES = ("user", "human")
# answers turn into text for the next turn's context without the special tokens: the template adds its own
Answer = Callable[[list[list[int]]], list[list[int]]]


def parse_pairs(items: list[str] | None, flag: str = "--set") -> dict[str, str]:
    """`NAME=FILE` items of the repeated --set, as {NAME: FILE}."""
    sets: dict[str, str] = {}
    for item in items or []:
        name, sep, file = item.partition("=")
        if not sep or not name.strip() or not file.strip():
            raise BadInput(f"{flag} {item!r}: expected NAME=FILE")
        sets[name.strip()] = file.strip()
    return sets


def resolve_path(file: str, base: Path) -> Path:
    """A set's file: relative to `base`, or `pkg:MODULE/PATH` inside an installed package (host.packaged)."""
    from specops.host.packaged import is_packaged, resolve_packaged

    if is_packaged(file):
        return resolve_packaged(file)
    path = Path(file).expanduser()
    return path if path.is_absolute() else base / path


def _lines(path: Path, where: str) -> list[str]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise BadInput(f"{where}: {path}: not a gzip file ({exc})") from None
    try:
        return raw.decode().splitlines()
    except UnicodeDecodeError:
        raise BadInput(f"{where}: {path}: not UTF-8 text") from None


def _user_turns(row: dict[str, Any], key: str, at: str) -> list[str]:
    value = row[key]
    if key == "turns":
        if not isinstance(value, list) or not value or not all(isinstance(turn, str) and turn for turn in value):
            raise BadInput(f"{at}: key 'turns': expected a non-empty list of strings")
        return list(value)
    if key in ("question", "prompt"):
        if not isinstance(value, str) or not value:
            raise BadInput(f"{at}: key {key!r}: expected a non-empty string")
        return [value]
    if not isinstance(value, list) or not all(isinstance(message, dict) for message in value):
        raise BadInput(f"{at}: key {key!r}: expected a list of messages")
    role, text = ("role", "content") if key == "messages" else ("from", "value")
    turns = [message.get(text) for message in value if message.get(role) in USER_ROLES]
    if not turns or not all(isinstance(turn, str) and turn for turn in turns):
        raise BadInput(f"{at}: key {key!r}: no user turn with text")
    return turns


def read_set(name: str, path: Path, limit: int | None = None) -> list[list[str]]:
    """The set's conversations as their user turns (the first `limit` conversations)."""
    where = f"evaluate.sets.{name}"
    conversations = []
    for number, line in enumerate(_lines(path, where), 1):
        if not line.strip():
            continue
        at = f"{path}:{number} ({where})"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{at}: not JSON ({exc.msg})") from None
        key = next((key for key in SHAPES if isinstance(row, dict) and key in row), None)
        if key is None:
            raise BadInput(f"{at}: expected one of the keys {', '.join(SHAPES)}")
        conversations.append(_user_turns(row, key, at))
        if limit and len(conversations) >= limit:
            break
    if not conversations:
        raise BadInput(f"{where}: {path}: no conversations")
    return conversations


def walk_turns(tokenizer: Any, conversations: list[list[str]], answer: Answer) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the target's answer ids) for every turn of every conversation: turn t of each is asked
    with the target's own answers to turns 1..t-1 in its context; `answer` answers a batch of prompts."""
    from specops.pipeline.data import render_ids

    histories: list[list[dict[str, str]]] = [[] for _ in conversations]
    pairs: list[tuple[list[int], list[int]]] = []
    for depth in range(max(len(turns) for turns in conversations)):
        live = [index for index, turns in enumerate(conversations) if depth < len(turns)]
        prompts = []
        for index in live:
            histories[index].append({"role": "user", "content": conversations[index][depth]})
            prompts.append(render_ids(tokenizer, histories[index], generation_prompt=True))
        for index, prompt, answered in zip(live, prompts, answer(prompts), strict=True):
            pairs.append((prompt, answered))
            histories[index].append({"role": "assistant",
                                     "content": tokenizer.decode(answered, skip_special_tokens=True)})
    return pairs
