"""Errors the agent reports as one clear line (exit 2 for bad input, 1 for failed checks)."""


class BadInput(Exception):
    """Bad input: a file, key or flag that is wrong. Rendered as one line, exit status 2."""

    exit_code = 2


class CheckFailed(Exception):
    """Something that was checked is not right. Exit status 1."""

    exit_code = 1
