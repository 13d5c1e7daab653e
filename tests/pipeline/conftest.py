"""Fixtures of the pipeline tests: the embedded tiny model made once, workdirs that copy it.

The agent runs as a subprocess (tests/support/agent.py), with the workdir in SPECOPS_WORKDIR and
torch on one thread, so CPU results are reproducible to the byte.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.support.agent import REPO

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the in-process parts too


@pytest.fixture(scope="session")
def tiny_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workdir holding runs/ (a copy of the repo's, on the source conversations) and the tiny model and data."""
    from specops.pipeline.data import tiny
    from tests.support.runs import from_source_conversations

    root = tmp_path_factory.mktemp("tiny-workdir")
    shutil.copytree(REPO / "runs", root / "runs")
    from_source_conversations(root / "runs" / "tiny.yaml")
    tiny.generate(root)
    return root


def copy_workdir(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, symlinks=True)
    return target


def in_workdir(workdir: Path):
    """Point the agent's code at workdir for in-process calls (the agent reads SPECOPS_WORKDIR)."""
    os.environ["SPECOPS_WORKDIR"] = str(workdir)
    from specops.pipeline.run import Run

    return Run("tiny", workdir)


@pytest.fixture(scope="session")
def prepared(tiny_workdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workdir where the tiny run is prepared and nothing is extracted."""
    import torch

    from specops.pipeline.data import prepare

    torch.set_num_threads(1)
    root = copy_workdir(tiny_workdir, tmp_path_factory.mktemp("prepared") / "w")
    run = in_workdir(root)
    prepare(run, run.samples_for(None), strict=False)  # as the engine's context hands it: the run's samples
    return root


@pytest.fixture(scope="session")
def extracted(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workdir where rows 0..39 were prepared and extracted uninterrupted, in process (prepare first, as the
    step table runs them: extraction reads prepare's rows and never runs it)."""
    from specops.pipeline.data import prepare
    from specops.pipeline.extraction.hf import extract

    root = copy_workdir(prepared, tmp_path_factory.mktemp("extracted") / "w")
    run = in_workdir(root)
    prepare(run, 40, strict=False)
    extract(run, 40)
    return root
