"""The agent's flag values: numbers and JSON objects; anything else is bad input (one line, exit 2)."""

from __future__ import annotations

import json
from typing import Any

from specops.errors import BadInput


def _positive(value: str, convert: type, kind: str, limit: str, *, show_parsed: bool) -> Any:
    """`value` as `convert` (int or float) > 0; else one line: "expected KIND" or "expected LIMIT"."""
    try:
        number = convert(value)
    except ValueError:
        raise BadInput(f"expected {kind}, got {value!r}") from None
    if number <= 0:
        raise BadInput(f"expected {limit}, got {number if show_parsed else value}")
    return number


def positive_int(value: str) -> int:
    """A whole number > 0."""
    return _positive(value, int, "a whole number", "a number > 0", show_parsed=True)


def non_negative_int(value: str) -> int:
    """A whole number >= 0 (e.g. a GPU count, where 0 means a CPU host)."""
    return 0 if value == "0" else positive_int(value)


def part_of(value: str) -> tuple[int, int]:
    """I/COUNT: this host's share I (0-based) of work cut into COUNT shares."""
    index, _, total = value.partition("/")
    if not (index.isdigit() and total.isdigit()) or not 0 <= int(index) < int(total):
        raise BadInput(f"expected I/COUNT with 0 <= I < COUNT, got {value!r}")
    return int(index), int(total)


def positive_seconds(value: str) -> float:
    """A duration in seconds > 0."""
    return _positive(value, float, "seconds", "seconds > 0", show_parsed=False)


def json_object(source: str, text: str | None) -> dict[str, Any] | None:
    """A JSON object given on the command line (None when not given); `source` names the flag."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{source}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, dict):
        raise BadInput(f"{source}: expected a JSON object, got {type(value).__name__}")
    return value
