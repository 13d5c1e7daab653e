"""Fixtures of the pipeline tests: the embedded tiny model made once, workdirs that copy it.

The agent runs as a subprocess (`python -m specops ...`), with the workdir in SPECOPS_WORKDIR and
torch on one thread, so CPU results are reproducible to the byte.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the in-process parts too
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))


def agent_env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONPATH=str(SRC), SPECOPS_WORKDIR=str(workdir), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    return env


def agent(workdir: Path, *args: str, timeout: float = 120) -> tuple[int, dict, str]:
    """Run `python -m specops ARGS` on the workdir: (exit code, the JSON document, stderr)."""
    done = subprocess.run([sys.executable, "-m", "specops", *args], cwd=workdir, env=agent_env(workdir),
                          capture_output=True, text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, f"expected one JSON line on stdout, got {done.stdout!r}\n{done.stderr}"
    return done.returncode, json.loads(lines[0]), done.stderr


def agent_popen(workdir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specops", *args], cwd=workdir, env=agent_env(workdir),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture(scope="session")
def tiny_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workdir holding runs/ (a copy of the repo's, on the source conversations) and the tiny model and data."""
    from specops.pipeline import tiny
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
    from specops.pipeline.config import Run

    return Run("tiny", workdir)


@pytest.fixture(scope="session")
def prepared(tiny_workdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workdir where the tiny run is prepared and nothing is extracted."""
    import torch

    from specops.pipeline.prepare import prepare

    torch.set_num_threads(1)
    root = copy_workdir(tiny_workdir, tmp_path_factory.mktemp("prepared") / "w")
    prepare(in_workdir(root), None, strict=False)
    return root


@pytest.fixture(scope="session")
def extracted(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workdir where rows 0..39 were extracted uninterrupted, in process."""
    from specops.pipeline.extract_hf import extract

    root = copy_workdir(prepared, tmp_path_factory.mktemp("extracted") / "w")
    extract(in_workdir(root), 40)
    return root
