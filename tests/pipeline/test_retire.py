"""Nothing trained is retired silently (issue 46): after the demo, `step extract --samples 10` (fewer rows than the
draft trained on) keeps the trained draft usable; a command that would drop a finished training is refused before
launch with one line naming --retire; with --retire it says where the results went, and `run restore` undoes it.
The launch boundary (`run check -- <command>`) also refuses an evaluate checkpoint that does not exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.agent import run_agent
from tests.support.finished import copy_of

pytestmark = pytest.mark.slow


def train_record(root: Path) -> dict | None:
    return json.loads((root / "runs" / "tiny" / "manifest.json").read_text())["steps"].get("train")


def test_fewer_rows_keep_the_draft_and_retiring_is_said_and_undone(finished: tuple[Path, dict],
                                                                    tmp_path: Path) -> None:
    root = copy_of(finished, tmp_path / "w")
    run_dir = root / "runs" / "tiny"
    trained = train_record(root)
    assert trained and (run_dir / "checkpoints").is_dir()

    # the README's `invoke extract --samples 10`: the rows already prepared serve, nothing is retired
    code, document, _ = run_agent(root, "run", "check", "--run", "tiny", "--", "step", "extract", "--run", "tiny",
                                  "--samples", "10")
    assert code == 0, document
    code, document, stderr = run_agent(root, "step", "extract", "--run", "tiny", "--samples", "10")
    assert code == 0, document
    assert train_record(root) == trained and (run_dir / "vocab").is_dir() and (run_dir / "evaluation").is_dir()
    code, document, _ = run_agent(root, "fetch-list", "--run", "tiny")
    assert code == 0, document

    # rows made again for fewer samples would drop the training: refused before launch, one line naming --retire
    code, document, _ = run_agent(root, "run", "check", "--run", "tiny", "--", "step", "prepare", "--run", "tiny",
                                  "--samples", "10")
    assert code == 2 and "--retire" in document["error"] and "\n" not in document["error"], document
    code, document, _ = run_agent(root, "step", "prepare", "--run", "tiny", "--samples", "10")
    assert code == 2 and "--retire" in document["error"], document
    assert train_record(root) == trained and (run_dir / "checkpoints").is_dir()

    # --retire: moved aside, said where, undone by `run restore`
    code, document, stderr = run_agent(root, "step", "prepare", "--run", "tiny", "--samples", "10", "--retire")
    assert code == 0, document
    assert "retired" in stderr and "invoke restore --run tiny --retired" in stderr, stderr
    assert not (run_dir / "checkpoints").exists() and train_record(root) is None
    [retired] = (run_dir / "retired").iterdir()
    assert (retired / "checkpoints").is_dir() and (retired / "vocab").is_dir()
    code, document, _ = run_agent(root, "run", "restore", "--run", "tiny")
    assert code == 0, document
    assert train_record(root) == trained and (run_dir / "checkpoints").is_dir() and (run_dir / "evaluation").is_dir()
    code, document, _ = run_agent(root, "fetch-list", "--run", "tiny")
    assert code == 0, document


@pytest.mark.parametrize(("launch", "says"), [
    (["step", "evaluate", "--run", "tiny", "--checkpoint", "99"], "epoch 99"),
    (["step", "evaluate", "--run", "tiny", "--sweep", "num_speculative_tokens=1,2", "--concurrency", "1,8",
      "--backend", "hf"], "--concurrency"),
    (["step", "evaluate", "--run", "tiny", "--sweep", "num_speculative_tokens=0"], "num_speculative_tokens"),
])
def test_the_launch_boundary_refuses_what_the_job_would(finished: tuple[Path, dict], tmp_path: Path,
                                                         launch: list[str], says: str) -> None:
    root = copy_of(finished, tmp_path / "w")
    code, document, _ = run_agent(root, "run", "check", "--run", "tiny", "--", *launch)
    assert code == 2 and says in document["error"], document
