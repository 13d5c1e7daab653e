"""The demo run through the whole pipeline, made once per test run and shared by every xdist worker.

`finished_pipeline(config, tmp_path_factory)` is a workdir after `python -m specops pipeline --run tiny`
(regenerated answers, held-out prompts, a trained draft and its hf evaluation) and the pipeline's
summary; `pipeline_log(finished)` is what it printed. The first worker to ask builds it under a file
lock in the run's shared temporary folder; the others wait for it and read the same folder. Tests never
change it: they copy it (`copy_of`) and work on the copy, which skips every step, since a run's inputs
count paths inside its workdir relative to it.
"""

from __future__ import annotations

import fcntl
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.agent import REPO, run_agent

# a whole pipeline on a loaded 2-core machine (the Kimi wrapper: 103 s quiet, ~9 min loaded)
BUILD_TIMEOUT_S = 1500
LOG_FILE = "pipeline.log"


def shared_folder(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every worker of this test run sees (the parent of the workers' own temp folders),
    or this process's own temp folder without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if hasattr(config, "workerinput") else base


def finished_pipeline(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """(workdir, the pipeline's summary): built by the first caller of this test run, read by the rest."""
    return shared_pipeline(config, tmp_path_factory, "finished-tiny", "tiny", _build)


def shared_pipeline(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory, label: str, run: str,
                    build: Callable[[Path], None]) -> tuple[Path, dict]:
    """(workdir, summary) of run `run`'s whole pipeline in a workdir `build` makes: built once per test run
    by the first caller (any xdist worker, under a file lock), read by the rest."""
    folder = shared_folder(config, tmp_path_factory) / label
    folder.mkdir(exist_ok=True)
    root, summary_file = folder / "w", folder / "summary.json"
    with (folder / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when the build fails
        if not summary_file.is_file():
            build(root)
            code, summary, stderr = run_agent(root, "pipeline", "--run", run, timeout=BUILD_TIMEOUT_S)
            assert code == 0, f"{summary}\n{stderr[-4000:]}"
            (folder / LOG_FILE).write_text(stderr)  # what the pipeline's job log would hold
            summary_file.write_text(json.dumps(summary))
    return root, json.loads(summary_file.read_text())


def _build(root: Path) -> None:
    from specops.pipeline.data import tiny

    shutil.rmtree(root, ignore_errors=True)  # a build that failed in another worker
    root.mkdir()
    shutil.copytree(REPO / "runs", root / "runs")
    (root / "patches").symlink_to(REPO / "patches")
    tiny.generate(root)


def pipeline_log(finished: tuple[Path, dict]) -> str:
    """Everything the pipeline printed (its stderr: the libraries' lines included), as a job logs it."""
    return (finished[0].parent / LOG_FILE).read_text()


def copy_of(finished: tuple[Path, dict], target: Path) -> Path:
    """A copy of the finished workdir to change freely."""
    shutil.copytree(finished[0], target, symlinks=True)
    return target
