"""The train-vs-serve parity gate: a draft whose config names other auxiliary layers than extraction captured
is refused with one line (the key, what training used, what serving will use), exit 1, before anything trains
and before anything is evaluated; an agreeing draft passes with every key read the way the installed vLLM
reads it (its loader's own code, compiled from its source; vLLM is never imported).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.agent import run_agent as agent
from tests.support.finished import copy_of
from tests.support.runs import edit_run
from tests.support.vllm import VLLM_PYTHON

AUX = "eagle_aux_hidden_state_layer_ids"
# the static reading of the installed vLLM where the serve env is here (no server: an hf run on a CPU host)
SERVE_ENV = {"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON)} if VLLM_PYTHON.exists() else {}


def _files(folder: Path) -> dict[str, int]:
    return {str(path.relative_to(folder)): path.stat().st_size for path in sorted(folder.rglob("*"))}


@pytest.mark.slow  # speculators' train --dry-run: ~20 s
def test_a_draft_naming_other_auxiliary_layers_is_refused_before_training(finished, tmp_path) -> None:
    root = copy_of(finished, tmp_path / "w")
    config = root / "runs" / "tiny.yaml"  # the trainer told other layers than extraction captured ([1, 2, 3])
    wrong = '  extra_args: ["--target-layer-ids", "0", "2", "3"]'
    config.write_text(config.read_text().replace("  extra_args: []", wrong))
    checkpoints = root / "runs" / "tiny" / "checkpoints"
    before, manifest = _files(checkpoints), (root / "runs" / "tiny" / "manifest.json").read_text()

    code, document, stderr = agent(root, "step", "train", "--run", "tiny", env=SERVE_ENV, timeout=600)

    assert code == 1, stderr[-3000:]
    assert document["error"].startswith(f"parity (before training): {AUX}: training used [1, 2, 3], "
                                        "serving will use [0, 2, 3]")
    assert "\n" not in document["error"]
    assert _files(checkpoints) == before and (root / "runs" / "tiny" / "manifest.json").read_text() == manifest
    assert "### specops trainer start" not in stderr  # no training step ran
    report = json.loads((root / "runs" / "tiny" / "parity" / "report.json").read_text())
    row = next(row for row in report["rows"] if row["key"] == AUX)
    assert (row["training"], row["serving"], row["ok"]) == ([1, 2, 3], [0, 2, 3], False)
    # the config it judged is speculators' own, written by `speculators train --dry-run` with these arguments
    untrained = json.loads((root / "runs" / "tiny" / "parity" / "untrained" / "config.json").read_text())
    assert untrained[AUX] == [0, 2, 3]


def test_a_checkpoint_naming_other_auxiliary_layers_is_refused_before_evaluation(finished, tmp_path) -> None:
    root = copy_of(finished, tmp_path / "w")
    run = root / "runs" / "tiny"
    chosen = finished[1]["evaluation"]["report"]["checkpoint"]
    config_file = run / "checkpoints" / chosen / "config.json"
    config = json.loads(config_file.read_text())
    assert config[AUX] == [1, 2, 3]
    config_file.write_text(json.dumps({**config, AUX: [2, 3, 4]}))  # one off: speculators #705
    report = (run / "evaluation" / "report.json").read_text()

    code, document, stderr = agent(root, "step", "evaluate", "--run", "tiny", "--backend", "vllm", env=SERVE_ENV)

    assert code == 1, stderr[-3000:]
    assert document["error"].startswith(f"parity (before evaluating {chosen}): {AUX}: training used [1, 2, 3], "
                                        "serving will use [2, 3, 4]")
    assert (run / "evaluation" / "report.json").read_text() == report
    code, jobs, _ = agent(root, "job", "list")  # refused before any server was started
    assert code == 0 and not [job for job in jobs["jobs"] if job.get("name") == "vllm-server"]


def test_a_checkpoint_naming_no_auxiliary_layers_is_refused_before_evaluation(finished, tmp_path) -> None:
    """vLLM #50170: without the ids in the draft's config vLLM captures the target's default layers, silently
    (acceptance 1.04 instead of 2.77); the gate reads that default from vLLM's own code and refuses."""
    root = copy_of(finished, tmp_path / "w")
    run = root / "runs" / "tiny"
    chosen = finished[1]["evaluation"]["report"]["checkpoint"]
    config_file = run / "checkpoints" / chosen / "config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({key: value for key, value in config.items() if key != AUX}))

    code, document, stderr = agent(root, "step", "evaluate", "--run", "tiny", "--backend", "vllm", env=SERVE_ENV)

    assert code == 1, stderr[-3000:]
    assert document["error"].startswith(f"parity (before evaluating {chosen}): {AUX}: training used [1, 2, 3], "
                                        "serving will use ")
    report = json.loads((run / "parity" / "report.json").read_text())
    row = next(row for row in report["rows"] if row["key"] == AUX)
    assert "the target's default: none in the draft config" in row["where"] and not row["ok"]


def test_the_finished_draft_agrees_key_by_key_with_the_installed_vllm(finished, tmp_path) -> None:
    root = copy_of(finished, tmp_path / "w")
    code, document, stderr = agent(root, "step", "parity", "--run", "tiny", "--checkpoint", "last", env=SERVE_ENV)
    assert code == 0, stderr[-3000:]
    rows = {row["key"]: row for row in document["rows"]}
    assert all(row["ok"] for row in rows.values())
    assert rows[AUX]["training"] == rows[AUX]["serving"] == [1, 2, 3]
    assert rows["draft_vocab_size"]["training"] == rows["d2t entries"]["serving"] == 256
    assert rows["t2d entries"]["serving"] == rows["vocab_size"]["training"] == 512
    assert rows["method"]["serving"] == "eagle3"
    if SERVE_ENV:  # vLLM's loader ran on the config: its flags, and the target's EAGLE-3 support
        assert document["vllm"] == "0.32.0"
        assert {"norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"} <= set(rows)
        assert rows["target architecture"]["serving"] == "LlamaForCausalLM (SupportsEagle3)"


@pytest.mark.skipif(not SERVE_ENV, reason="the serve env (.venv-vllm) is absent: scripts/setup-vllm.sh")
def test_a_run_that_turns_the_served_request_off_is_gated_on_its_config_alone(finished, tmp_path) -> None:
    root = copy_of(finished, tmp_path / "w")
    # a vllm run is where the served request is cheap; `parity.serve: false` says a server load is not
    edit_run(root / "runs" / "tiny.yaml", backend="vllm", parity={"serve": False})

    code, document, stderr = agent(root, "step", "parity", "--run", "tiny", env=SERVE_ENV, timeout=600)

    assert code == 0, stderr[-3000:]
    assert document["when"] == "before training" and document["ok"]
    assert "served" not in document
    code, jobs, _ = agent(root, "job", "list")
    assert code == 0 and not [job for job in jobs["jobs"] if job.get("name") == "vllm-server"]


def test_a_parity_serve_that_is_not_a_yes_or_no_is_one_line_exit_2(finished, tmp_path) -> None:
    root = copy_of(finished, tmp_path / "w")
    edit_run(root / "runs" / "tiny.yaml", parity={"serve": "sometimes"})

    code, document, _ = agent(root, "step", "parity", "--run", "tiny", env=SERVE_ENV)

    assert code == 2
    assert document["error"].startswith("runs/tiny.yaml: parity.serve:"), document["error"]
    assert "\n" not in document["error"]
