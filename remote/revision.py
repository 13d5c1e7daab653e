"""The revision of this checkout that a host receives: git commit and whether the tree is dirty."""

from __future__ import annotations

import subprocess
from functools import cache

from remote.inventory import REPO_ROOT


@cache
def current_revision() -> dict[str, object]:
    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", "src", "patches", "runs")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}
