"""Fixtures of the evaluation tests: the demo run through the whole pipeline once (hf backend).

`evaluated` is a workdir after `python -m specops pipeline --run tiny`: regenerated answers,
held-out prompts, a trained draft and its hf evaluation. Tests copy it before changing anything.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.agent import REPO
from tests.support.agent import run_agent as agent


@pytest.fixture(scope="session")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """(workdir, the pipeline's summary)."""
    from specops.pipeline.data import tiny

    root = tmp_path_factory.mktemp("evaluated") / "w"
    root.mkdir()
    shutil.copytree(REPO / "runs", root / "runs")
    (root / "patches").symlink_to(REPO / "patches")
    tiny.generate(root)
    code, summary, stderr = agent(root, "pipeline", "--run", "tiny", "--skip-doctor", timeout=1500)
    assert code == 0, f"{summary}\n{stderr[-4000:]}"
    return root, summary


def copy_of(evaluated: tuple[Path, dict], target: Path) -> Path:
    shutil.copytree(evaluated[0], target, symlinks=True)
    return target
