"""`doctor --run NAME`: the run's settings come straight from the loaded run (pipeline/preflight.py),
and the doctor judges exactly the command lines the run's steps will launch."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specops.doctor import RunSettings
from tests.support.agent import REPO, run_agent


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "runs", tmp_path / "runs")
    return tmp_path


def test_preflight_reads_the_run_and_its_launch_commands(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECOPS_WORKDIR", str(workdir))
    from specops.pipeline import open_run
    from specops.pipeline.preflight import run_settings

    settings = run_settings("tiny")
    run = open_run("tiny")
    assert isinstance(settings, RunSettings)
    assert settings.model_path == str(run.model_path) and Path(settings.model_path, "config.json").is_file()
    assert settings.layer_ids == run.layer_ids()
    assert settings.draft_vocab_size == run.config.draft.vocab_size
    assert (settings.samples, settings.max_seq_len) == (run.config.samples, run.config.max_seq_len)
    assert settings.output_dir == str(run.paths.hidden_states)
    assert settings.backend == "hf" and settings.serve_flags == []  # runs/tiny.yaml: the hf backend
    assert "--draft-vocab-size" in settings.train_flags and all(f.startswith("--") for f in settings.train_flags)


def test_doctor_with_run_checks_the_run(workdir: Path) -> None:
    code, document, stderr = run_agent(workdir, "doctor", "--run", "tiny")
    assert document["scope"] == "run" and document["run"] == "tiny", stderr[-2000:]
    checks = {f["check"] for f in document["findings"]}
    assert {"api", "flags", "model", "resources"} <= checks
    layer = next(f for f in document["findings"] if f["where"] == "layer_ids")
    assert layer["result"] == "ok"
    assert any(f["where"].startswith("speculators train --") for f in document["findings"] if f["check"] == "flags")
    assert code == (0 if document["ok"] else 1)


def test_a_bad_run_name_is_one_line_and_exit_2(workdir: Path) -> None:
    code, document, _ = run_agent(workdir, "doctor", "--run", "no-such-run")
    assert code == 2 and "no-such-run" in document["error"] and "\n" not in document["error"]
