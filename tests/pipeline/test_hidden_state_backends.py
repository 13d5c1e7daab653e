"""`hidden_states.backend: file | fp8 | mooncake` (speculators' hs_connectors backends): the run config's key, both
ends' arguments as hs_connectors builds them, and an fp8 run of the tiny model that extracts (quantised with
hs_connectors' own quantize_tensor_to_fp8), validates (read back dequantised through FP8Transfer) and trains."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from specops.contract.errors import BadInput
from specops.pipeline.extraction import file_for, read_sample, verify_header, write_sample
from specops.pipeline.extraction.budget import row_bytes
from specops.pipeline.run.config import load_run_config
from specops.pipeline.training.command import TrainPlan, build_train_command
from specops.pipeline.validation import validate
from specops.pipeline.vllm.command import kv_transfer_config
from tests.support.agent import run_agent
from tests.support.runs import edit_run

from .conftest import copy_workdir, in_workdir


def _config(tmp_path: Path, hidden_states: dict) -> Path:
    path = tmp_path / "runs" / "r.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"model": "m", "data": "d.jsonl", "hidden_states": hidden_states}))
    return path


@pytest.mark.parametrize(("hidden_states", "message"), [
    ({"backend": "nvme"}, "hidden_states.backend: must be 'file', 'fp8' or 'mooncake'"),
    ({"backend": "mooncake", "mode": "offline"}, "hidden_states: backend mooncake keeps no files, so mode offline"),
])
def test_a_bad_backend_is_one_line_naming_file_and_key(tmp_path: Path, hidden_states: dict, message: str) -> None:
    with pytest.raises(BadInput) as caught:
        load_run_config(_config(tmp_path, hidden_states))
    line = str(caught.value)
    assert line.startswith(str(tmp_path / "runs" / "r.yaml")) or line.startswith("runs/r.yaml"), line
    assert message in line and "\n" not in line


def test_the_default_is_file(tmp_path: Path) -> None:
    assert load_run_config(_config(tmp_path, {})).hidden_states.backend == "file"


def test_the_server_config_is_hs_connectors_own(tmp_path: Path) -> None:
    from hs_connectors import FileBackend, FP8Backend

    staging = tmp_path / "staging"
    args = argparse.Namespace(hidden_states_path=str(staging))
    # file is written out (no torch import for a file run's command): it must equal FileBackend's
    assert kv_transfer_config(staging) == FileBackend.build_kv_transfer_config(args)
    fp8 = kv_transfer_config(staging, "fp8")
    assert fp8 == FP8Backend.build_kv_transfer_config(args)
    assert fp8["kv_connector"] == "FP8HiddenStatesConnector"
    assert fp8["kv_connector_module_path"] == "hs_connectors.fp8_hidden_states_connector"
    mooncake = kv_transfer_config(staging, "mooncake")
    assert mooncake["kv_connector"] == "MooncakeHiddenStatesConnector"
    assert mooncake["kv_connector_extra_config"]["mooncake"]["master_server_address"] == "127.0.0.1:50051"


def test_the_trainer_is_told_the_backend(tmp_path: Path) -> None:
    plan = TrainPlan(verifier="m", data_path=tmp_path, hidden_states_path=tmp_path / "hs", save_path=tmp_path / "c",
                     target_layer_ids=(1, 2), draft_vocab_size=64)
    assert "--hidden-states-backend" not in build_train_command(plan, 0)
    command = build_train_command(TrainPlan(**{**vars(plan), "hidden_states_backend": "fp8"}), 0)
    assert command[command.index("--hidden-states-backend") + 1] == "fp8"  # speculators takes it: the slow test


def test_an_fp8_file_is_hs_connectors_format_and_its_size_is_planned(tmp_path: Path) -> None:
    from hs_connectors.fp8_utils import SCALES_KEY

    states = torch.randn(9, 4, 64)
    size = write_sample(tmp_path, 0, torch.arange(9), states, fp8=True)
    stored = load_file(str(file_for(tmp_path, 0)))
    assert stored["hidden_states"].dtype == torch.float8_e4m3fn and stored[SCALES_KEY].shape == (9, 1, 1)
    assert verify_header(file_for(tmp_path, 0), 9, 4, 64, "float8_e4m3fn") is None
    assert "keys are" in verify_header(file_for(tmp_path, 0), 9, 4, 64, "float32")
    assert size <= row_bytes(9, 4, 64, "float8_e4m3fn") < row_bytes(9, 4, 64, "bfloat16")
    back = read_sample(tmp_path, 0, "fp8")["hidden_states"]  # FP8Transfer: dequantised, scales dropped
    assert back.dtype == torch.float32 and float((back - states).abs().max() / states.abs().max()) < 0.07


@pytest.mark.slow
def test_an_fp8_run_extracts_validates_and_trains(prepared: Path, extracted: Path, tmp_path: Path) -> None:
    from specops.pipeline.data import prepare
    from specops.pipeline.extraction.hf import extract

    root = copy_workdir(prepared, tmp_path / "w")
    edit_run(root / "runs" / "tiny.yaml", hidden_states={"backend": "fp8"}, train={"epochs": 1})
    run = in_workdir(root)
    prepare(run, 40, strict=False)
    report = extract(run, 40)
    assert report["counts"]["samples"] == 40
    folder = root / "runs" / "tiny" / "hidden_states"
    fp8_bytes = sum(file_for(folder, i).stat().st_size for i in range(40))
    file_bytes = sum(file_for(extracted / "runs" / "tiny" / "hidden_states", i).stat().st_size for i in range(40))
    assert fp8_bytes < 0.3 * file_bytes  # fp32 on the CPU: a quarter, and the scales

    # as the pipeline validates fp8: 4 rows leave too few decidable
    checked = validate(in_workdir(root), 12, run_backend="hf")
    fidelity = checked["checks"]["fidelity"]["detail"]
    assert checked["ok"], json.dumps(checked)[:2000]
    assert fidelity["hidden_states_backend"] == "fp8" and fidelity["rule"]["dtype"] == "float8_e4m3fn"
    assert fidelity["agreement"] >= 0.98 and fidelity["agreement_all_positions"] >= 0.85

    code, document, stderr = run_agent(root, "step", "train", "--run", "tiny", timeout=900)
    assert code == 0, f"{json.dumps(document)[:2000]}\n{stderr[-3000:]}"
    assert "--hidden-states-backend" in document["command"]
    assert (root / "runs" / "tiny" / "checkpoints" / "0" / "model.safetensors").is_file()

    # a shifted fp8 file is caught as a shifted file file would be
    path = file_for(folder, 0)
    tensors = load_file(str(path))
    for key in ("hidden_states", "hidden_states_scales"):
        tensors[key] = tensors[key].roll(1, dims=0).contiguous()
    save_file(tensors, str(path))
    shifted = validate(in_workdir(root), 1, run_backend="hf")
    assert not shifted["ok"] and not shifted["checks"]["fidelity"]["ok"]
