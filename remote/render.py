"""Human output: rich tables and coloured status, on stdout, or on stderr when --json owns stdout."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich loads only when something is rendered: `invoke --list` stays quick
    from rich.console import Console
    from rich.table import Table


def console(json_mode: bool = False) -> Console:
    from rich.console import Console

    plain = bool(os.environ.get("NO_COLOR")) or not (sys.stderr if json_mode else sys.stdout).isatty()
    # emoji=False: a host name or path like `a:tada:b` stays as written, and rich's emoji table
    # (2k names) is never loaded.
    return Console(stderr=json_mode, no_color=plain, highlight=False, soft_wrap=False, emoji=False,
                   width=None if not plain else 160)


def status_text(ok: bool | None, text: str | None = None) -> str:
    if ok is None:
        return f"[yellow]{text or 'unknown'}[/]"
    return f"[green]{text or 'ok'}[/]" if ok else f"[red]{text or 'FAIL'}[/]"


def human_bytes(count: float | None) -> str:
    if count is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def table(title: str, columns: list[str]) -> Table:
    from rich.table import Table

    # a table of label/value rows names no columns: no header row then (an empty one is noise)
    result = Table(title=title, title_justify="left", show_lines=False, show_header=any(columns))
    for column in columns:
        result.add_column(column, overflow="fold")
    return result
