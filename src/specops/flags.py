"""argparse types of the agent's numeric flags: anything else is bad input (one line, exit 2)."""

from __future__ import annotations

from specops.errors import BadInput


def positive_int(value: str) -> int:
    """A whole number > 0."""
    try:
        number = int(value)
    except ValueError:
        raise BadInput(f"expected a whole number, got {value!r}") from None
    if number <= 0:
        raise BadInput(f"expected a number > 0, got {number}")
    return number


def non_negative_int(value: str) -> int:
    """A whole number >= 0 (e.g. a GPU count, where 0 means a CPU host)."""
    return 0 if value == "0" else positive_int(value)


def positive_seconds(value: str) -> float:
    """A duration in seconds > 0."""
    try:
        number = float(value)
    except ValueError:
        raise BadInput(f"expected seconds, got {value!r}") from None
    if number <= 0:
        raise BadInput(f"expected seconds > 0, got {value}")
    return number
