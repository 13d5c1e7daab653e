"""Names that become local paths (hosts, runs, jobs): checked where they are read, and every path
built from them checked to stay inside its root. One pattern for both sides: specops.contract.protocol."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from remote.errors import BadInput, SpecopsError
from specops.contract.protocol import name_problem, stays_inside


def safe_name(value: object, where: str) -> str:
    """`value` when it is a safe name; else BadInput naming `where` (a flag, or file and key)."""
    problem = name_problem(value)
    if problem is not None:
        raise BadInput(f"{where}: {problem}")
    assert isinstance(value, str)
    return value


def inside(root: Path, *parts: str, what: str = "path") -> Path:
    """`root` joined with `parts`, refused unless it stays inside `root` (the parts may come from a host)."""
    relative = PurePosixPath(*parts)
    if not parts or not stays_inside(relative):
        raise SpecopsError(f"{what} {str(relative)!r} would leave {root}; refused")
    return root.joinpath(*relative.parts)
