"""Errors the agent reports as one clear line (exit 2 for bad input, 1 for failed checks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class BadInput(Exception):
    """Bad input: a file, key or flag that is wrong. Rendered as one line, exit status 2."""

    exit_code = 2


class CheckFailed(Exception):
    """Something that was checked is not right. Exit status 1."""

    exit_code = 1


def as_bad_input(parse: Callable[..., T], *args: object) -> T:
    """parse(*args), its ValueError (a flag's value a reader refused, in one line) made BadInput: exit 2."""
    try:
        return parse(*args)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
