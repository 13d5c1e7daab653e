"""The run config's training settings as the agent reads them: optimizer, log_freq and loader_workers
reach `speculators train`'s argv (`step train --dry-run`); bad values are one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.agent import run_agent as agent
from tests.training.test_command import flag


def workdir_with(tmp_path: Path, train: dict) -> Path:
    """A workdir whose run `s` names a target folder holding only its config.json (no weights needed)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 8,
                                                   "hidden_size": 64, "vocab_size": 512}))
    (tmp_path / "runs").mkdir()
    config = {"model": str(model), "data": "conversations.jsonl", "draft": {"vocab_size": 256}, "train": train}
    (tmp_path / "runs" / "s.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


def test_the_settings_reach_speculators_argv(tmp_path: Path) -> None:
    root = workdir_with(tmp_path, {"optimizer": "adamw", "log_freq": 10, "loader_workers": 6})
    code, document, stderr = agent(root, "step", "train", "--run", "s", "--dry-run", "--gpus", "1")
    assert code == 0, stderr
    command = document["command"]
    assert command[:2] == ["speculators", "train"]
    assert flag(command, "--optimizer") == ["adamw"]
    assert flag(command, "--log-freq") == ["10"]
    assert flag(command, "--num-workers") == ["6"]


def test_unset_settings_leave_speculators_defaults(tmp_path: Path) -> None:
    root = workdir_with(tmp_path, {"epochs": 2})
    code, document, stderr = agent(root, "step", "train", "--run", "s", "--dry-run", "--gpus", "1")
    assert code == 0, stderr
    assert not {"--optimizer", "--log-freq", "--num-workers"} & set(document["command"])


@pytest.mark.parametrize(("train", "message"), [
    ({"optimizer": "sgd"}, "runs/s.yaml: train.optimizer: must be 'adamw' or 'muon'"),
    ({"log_freq": 0}, "runs/s.yaml: train.log_freq: must be > 0"),
    ({"log_freq": "often"}, "runs/s.yaml: train.log_freq: must be a valid integer"),
    ({"loader_workers": -1}, "runs/s.yaml: train.loader_workers: must be >= 0"),
])
def test_bad_values_are_one_line_and_exit_2(tmp_path: Path, train: dict, message: str) -> None:
    root = workdir_with(tmp_path, train)
    code, document, _ = agent(root, "step", "train", "--run", "s", "--dry-run", "--gpus", "1")
    assert code == 2
    assert document["error"].startswith(message), document["error"]
    assert "\n" not in document["error"]


def test_the_step_names_what_it_pins_and_a_hosts_own_value(tmp_path: Path) -> None:
    root = workdir_with(tmp_path, {"epochs": 1})
    code, document, stderr = agent(root, "step", "train", "--run", "s", "--dry-run", "--gpus", "1")
    assert code == 0, stderr
    assert document["pinned"] == {"SPECOPS_FIXED_LOSS_TILE": "1", "TORCHINDUCTOR_DETERMINISTIC": "1"}
    code, document, stderr = agent(root, "step", "train", "--run", "s", "--dry-run", "--gpus", "1",
                                   env={"TORCHINDUCTOR_DETERMINISTIC": "0"})
    assert code == 0, stderr
    assert document["pinned"]["TORCHINDUCTOR_DETERMINISTIC"] == "0"
