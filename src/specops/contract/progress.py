"""Progress for people: one line on stderr (a job's log), flushed at once; stdout is the one JSON document."""

from __future__ import annotations

import sys
from collections.abc import Callable


def say(message: str, who: str = "specops") -> None:
    print(f"{who}: {message}", file=sys.stderr, flush=True)


def speaker(who: str) -> Callable[[str], None]:
    """`say` for one room: its lines start with `who:` (evaluate, parity, vllm, ...)."""
    return lambda message: say(message, who)
