"""Fixtures of the regenerate tests: a tiny workdir whose run regenerates with short answers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.agent import run_agent as agent
from tests.support.repo import REPO
from tests.support.runs import edit_run

LOG_FILE = "regenerate.log"


@pytest.fixture(scope="session")
def regen_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model and data; run `tiny` regenerates 24-token answers in batches of 16."""
    from specops.pipeline.data import tiny

    root = tmp_path_factory.mktemp("regen-workdir")
    shutil.copytree(REPO / "runs", root / "runs")
    edit_run(root / "runs" / "tiny.yaml", regenerate={"max_tokens": 24, "concurrency": 16})
    tiny.generate(root)
    return root


@pytest.fixture(scope="session")
def regenerated(regen_workdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the workdir after one uninterrupted `step regenerate`; what it printed beside it (LOG_FILE),
    a progress line at every generation step (the tiny model answers a batch in about a second)."""
    root = tmp_path_factory.mktemp("regenerated") / "w"
    shutil.copytree(regen_workdir, root, symlinks=True)
    code, document, stderr = agent(root, "step", "regenerate", "--run", "tiny", timeout=600,
                                   env={"SPECOPS_PROGRESS_S": "0"})
    assert code == 0, f"{document}\n{stderr[-3000:]}"
    (root.parent / LOG_FILE).write_text(stderr)
    return root
