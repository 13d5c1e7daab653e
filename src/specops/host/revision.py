"""Which specops this agent is: the git commit of the checkout it came from, and whether that checkout was dirty.

The agent on a host runs from a copy of the workstation's src/ (synced, or installed with the agent's
bundle), where there is no git. The workstation writes what it knows beside the copy, in the same transfer:
state/revision.json ({"commit", "dirty", "bundle"}: the commit, whether src/ patches/ runs/ differed from it,
and the bundle's content hash) next to state/agent.sha256 (the hash of the bundle the host holds). The two
agree when the copy is the one the revision describes; they disagree when the copy was replaced by an agent
that wrote no revision (an older workstation), and then the revision is not known rather than wrong.

An agent run straight from a checkout (tests, a developer's workstation as host) asks that checkout's git.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from specops.host import paths

REVISION_FILE = "revision.json"
BUNDLE_FILE = "agent.sha256"
# what a checkout ships to hosts: a change elsewhere (tests/, docs) does not make the agent dirty
SHIPPED = ("src", "patches", "runs")


def source_root() -> Path:
    """The folder holding this agent's specops/ package (the workdir's src/ on a synced host)."""
    return Path(__file__).resolve().parents[2]


def agent_revision() -> dict[str, Any]:
    """{"commit", "dirty", "bundle", "from"}: from the workstation's note beside a synced or installed copy
    ("from": "sync"), from the checkout's own git ("from": "checkout"), or unknown (commit and dirty None,
    "from" saying why)."""
    workdir = paths.workdir()
    state = workdir / "state"
    if source_root() == (workdir / "src").resolve():
        return _synced(state)
    return _checkout(source_root().parent)


def _synced(state: Path) -> dict[str, Any]:
    try:
        bundle = (state / BUNDLE_FILE).read_text().strip() or None
    except OSError:
        bundle = None
    try:
        noted = json.loads((state / REVISION_FILE).read_text())
    except (OSError, ValueError):
        noted = None
    if not isinstance(noted, dict):
        return {"commit": None, "dirty": None, "bundle": bundle, "from": "unknown: no state/revision.json"}
    if noted.get("bundle") not in (None, bundle):  # a note older than the copy: it describes another agent
        return {"commit": None, "dirty": None, "bundle": bundle,
                "from": "unknown: state/revision.json describes another bundle"}
    return {"commit": noted.get("commit"), "dirty": noted.get("dirty"), "bundle": bundle, "from": "sync"}


def _checkout(root: Path) -> dict[str, Any]:
    """The checkout's commit and whether what it ships differs from it (one git process, as the workstation's
    remote.revision asks it)."""
    try:
        done = subprocess.run(["git", "status", "--porcelain=v2", "--branch", "--untracked-files=no", "--",
                               *SHIPPED], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        done = None
    if done is None or done.returncode != 0:
        return {"commit": None, "dirty": None, "bundle": None, "from": f"unknown: {root} is not a git checkout"}
    lines = done.stdout.splitlines()
    oid = next((line.split()[2] for line in lines if line.startswith("# branch.oid ")), None)
    return {"commit": None if oid in (None, "(initial)") else oid,
            "dirty": any(not line.startswith("#") for line in lines), "bundle": None, "from": "checkout"}
