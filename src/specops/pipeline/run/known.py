"""The runs a workdir knows, for the line that says a run config is missing (issue 46: `--run tiny.yaml`)."""

from __future__ import annotations

from pathlib import Path


def known_runs(missing: Path) -> str:
    """What to add to "runs/X.yaml: no such run config": the name a `--run X.yaml` meant, and the known runs."""
    known = sorted(candidate.stem for candidate in missing.parent.glob("*.yaml")) if missing.parent.is_dir() else []
    named = missing.name.removesuffix(".yaml")
    hint = f" (--run takes the name: --run {named.removesuffix('.yaml')})" if named.endswith(".yaml") else ""
    return f"{hint}; known runs: {', '.join(known) or 'none'}"
