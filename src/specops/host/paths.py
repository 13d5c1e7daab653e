"""Where the agent keeps its things on the host.

The control side runs every agent command with the working directory set to the host's workdir
and SPECOPS_WORKDIR pointing at it; state that the host owns lives below it.
"""

from __future__ import annotations

import os
from pathlib import Path


def workdir() -> Path:
    return Path(os.environ.get("SPECOPS_WORKDIR") or os.getcwd()).resolve()


def state_dir(*parts: str) -> Path:
    """A folder under workdir/state (patch records, job records, ...), created on demand."""
    path = workdir().joinpath("state", *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
