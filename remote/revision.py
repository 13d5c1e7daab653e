"""The revision of this checkout that a host receives: git commit and whether the tree is dirty."""

from __future__ import annotations

import json
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

    # One git process: porcelain v2's header names the commit, any other line is a change to what ships.
    status = git("status", "--porcelain=v2", "--branch", "--untracked-files=no", "--", "src", "patches", "runs")
    if status is None:
        return {"commit": None, "dirty": None}
    lines = status.splitlines()
    oid = next((line.split()[2] for line in lines if line.startswith("# branch.oid ")), None)
    return {"commit": None if oid in (None, "(initial)") else oid,
            "dirty": any(not line.startswith("#") for line in lines)}


def revision_note(bundle_digest: str) -> str:
    """state/revision.json as a host keeps it beside its copy of the agent: the revision, and the bundle it
    describes (the agent believes the note only while state/agent.sha256 names that bundle)."""
    return json.dumps({**current_revision(), "bundle": bundle_digest}) + "\n"
