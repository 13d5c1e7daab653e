"""Pure text work: apply a file's patches to its pristine text, or say exactly why they do not fit."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from specops.patching.spec import Patch


@dataclass(frozen=True)
class Misfit:
    patch: str
    detail: str  # one line: which replacement, expected vs found, lines of the occurrences


def _lines_of(text: str, needle: str) -> list[int]:
    lines, start = [], 0
    while (index := text.find(needle, start)) != -1:
        lines.append(text.count("\n", 0, index) + 1)
        start = index + 1
    return lines


def _first_line(text: str) -> str:
    stripped = text.strip().splitlines()
    return stripped[0].strip()[:60] if stripped else repr(text)


def apply_patches(pristine: str, patches: list[Patch], file_label: str) -> tuple[str, list[Misfit]]:
    """Text after applying the patches in order, and every replacement that did not fit.

    Each `old` must occur exactly `count` times in the text as the earlier patches left it.
    """
    text = pristine
    misfits = []
    for patch in patches:
        for number, replacement in enumerate(patch.replacements, 1):
            lines = _lines_of(text, replacement.old)
            if len(lines) == replacement.count:
                text = text.replace(replacement.old, replacement.new)
                continue
            anchor = _first_line(replacement.old)
            if not lines:
                hint = ""
                if replacement.new in text:
                    hint = " (its replacement text is present: applied without a record?)"
                detail = f"{file_label}: replace[{number}] '{anchor}' not found{hint}"
            else:
                where = ", ".join(f"line {line}" for line in lines)
                detail = (f"{file_label}: replace[{number}] '{anchor}' occurs {len(lines)} times "
                          f"({where}), patch expects {replacement.count}")
            misfits.append(Misfit(patch.id, detail))
    return text, misfits


def unified_diff(before: str, after: str, label: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"{label} (installed)", tofile=f"{label} (patched)"))
