"""The values of `evaluate --sweep` and `--concurrency`, read the same way by the workstation (before
anything is launched) and the agent. Standard library only; a bad value raises ValueError with what
is wrong, which each side turns into its one-line bad input."""

from __future__ import annotations

SETTINGS = ("num_speculative_tokens",)  # what a sweep can vary
MAX_SPECULATIVE_TOKENS = 16  # beyond this no server is worth asking


def positive_list(text: str, flag: str, highest: int | None = None) -> list[int]:
    """`1,8` -> [1, 8]: whole numbers > 0 (at most `highest`), each once, in the order given."""
    values: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1 or (highest is not None and int(part) > highest):
            bound = f" up to {highest}" if highest else ""
            raise ValueError(f"{flag}: expected whole numbers > 0{bound} separated by commas, got {text!r}")
        if int(part) in values:
            raise ValueError(f"{flag}: {part} appears twice in {text!r}")
        values.append(int(part))
    return values


def sweep_setting(text: str) -> list[int]:
    """`num_speculative_tokens=1,2,3` -> [1, 2, 3]."""
    name, _, values = str(text).partition("=")
    if name.strip() not in SETTINGS or not values.strip():
        raise ValueError(f"--sweep: expected {SETTINGS[0]}=1,2,3 (a comma-separated list), got {text!r}")
    return positive_list(values, f"--sweep {SETTINGS[0]}", MAX_SPECULATIVE_TOKENS)
