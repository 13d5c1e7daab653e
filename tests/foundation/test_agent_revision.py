"""Which specops an agent is, on a host that has no git: the workstation's revision travels with the agent.

`invoke check` installs the agent's bundle, and the revision of this checkout lands beside it
(state/revision.json, naming the bundle it describes); the agent run from that copy says it came from this
checkout's commit. A note that describes another bundle is not believed. An agent run from a checkout asks
the checkout's git.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.agent import PYTHON
from tests.support.cli import Cli
from tests.support.repo import REPO

pytestmark = pytest.mark.ssh

ASK = "import json; from specops.host.revision import agent_revision; print(json.dumps(agent_revision()))"


def _revision_from(workdir: Path, src: Path) -> dict:
    done = subprocess.run([str(PYTHON), "-c", ASK], capture_output=True, text=True, check=True, cwd=workdir,
                          env={"PATH": "/usr/bin:/bin", "SPECOPS_WORKDIR": str(workdir), "PYTHONPATH": str(src)})
    return json.loads(done.stdout)


def _head() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()


def test_the_installed_agent_names_the_workstations_revision(cli: Cli, tmp_path: Path) -> None:
    workdir = tmp_path / "local-workdir"
    assert cli("check", "--host", "local").exit_code == 0  # installs the bundle (no sync)
    note = json.loads((workdir / "state" / "revision.json").read_text())
    bundle = (workdir / "state" / "agent.sha256").read_text()
    assert note["bundle"] == bundle and isinstance(note["dirty"], bool)
    revision = _revision_from(workdir, workdir / "src")
    assert revision == {"commit": note["commit"], "dirty": note["dirty"], "bundle": bundle, "from": "sync"}
    assert revision["commit"] == _head() or subprocess.run(  # others may commit meanwhile: this one or before
        ["git", "merge-base", "--is-ancestor", revision["commit"], "HEAD"], cwd=REPO).returncode == 0

    # the copy replaced by an agent that wrote no note (an older workstation): unknown, not a wrong commit
    (workdir / "state" / "agent.sha256").write_text("another bundle")
    stale = _revision_from(workdir, workdir / "src")
    assert stale["commit"] is None and stale["from"].startswith("unknown: ")


def test_an_agent_run_from_a_checkout_asks_its_git(tmp_path: Path) -> None:
    revision = _revision_from(tmp_path, REPO / "src")
    assert revision["from"] == "checkout" and len(revision["commit"]) == 40 and isinstance(revision["dirty"], bool)
