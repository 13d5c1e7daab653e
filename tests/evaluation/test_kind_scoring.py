"""A kind of draft the run's evaluation cannot score is said before training (issue 57): the hf replay drafts as
EAGLE-3 only, so a run that trains another kind under it is scored through the host's serve env where one is named,
and otherwise told at its entry that no acceptance figure will come, rather than after minutes of training."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.support.agent import REPO, run_agent
from tests.support.vllm import VLLM_PYTHON, needs_vllm


@pytest.fixture
def dflash_under_hf(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "runs", tmp_path / "runs")
    config_file = tmp_path / "runs" / "tiny.yaml"
    config = yaml.safe_load(config_file.read_text())
    config.update(backend="hf", draft={"method": "dflash", "vocab_size": 256})
    config_file.write_text(yaml.safe_dump(config))
    return tmp_path


def settings(workdir: Path, **env: str) -> dict:
    code, document, stderr = run_agent(workdir, "run", "check", "--run", "tiny", env=env)
    assert code == 0, (document, stderr)
    return document["settings"]


def test_without_a_serve_env_the_run_says_at_its_entry_that_no_figure_will_come(dflash_under_hf: Path) -> None:
    found = settings(dflash_under_hf)
    assert found["evaluate_backend"] == "hf"
    assert found["notes"] == [
        "evaluate: the dflash draft this run trains gets no acceptance figure here: the hf replay drafts as EAGLE-3 "
        "only and no serve env with vLLM is named (inventory envs.serve), or evaluate.backend is hf in "
        "runs/tiny.yaml"]


@needs_vllm
def test_with_a_serve_env_the_draft_is_scored_by_its_vllm(dflash_under_hf: Path) -> None:
    found = settings(dflash_under_hf, SPECOPS_SERVE_PYTHON=str(VLLM_PYTHON))
    assert found["evaluate_backend"] == "vllm"
    assert found["origins"]["evaluate_backend"] == "the serve env: the hf replay cannot draft as a dflash draft does"
    assert any(note.startswith("evaluate: the dflash draft is scored through the serve env's vLLM") for note in
               found["notes"])


def test_an_eagle3_run_under_hf_is_left_as_it_is(tmp_path: Path) -> None:
    shutil.copytree(REPO / "runs", tmp_path / "runs")
    found = settings(tmp_path)
    assert found["evaluate_backend"] == found["backend"] and not found["notes"]
