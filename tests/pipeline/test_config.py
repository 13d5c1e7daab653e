"""Run configs: validation with one clear line, derived layer ids, stable hashes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specops.contract.errors import BadInput
from specops.pipeline.run import config_hash, derive_layer_ids, load_run_config, text_config
from tests.support.agent import REPO
from tests.support.agent import run_agent as agent


def write_config(folder: Path, text: str) -> Path:
    path = folder / "runs" / "bad.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_repositorys_tiny_run_is_valid():
    config = load_run_config(REPO / "runs" / "tiny.yaml")
    assert config.embedded == "tiny"
    assert config.backend == "hf"
    assert config.draft.vocab_size == 256


@pytest.mark.parametrize(("layers", "expected"), [(32, [2, 16, 29, 32]), (61, [2, 30, 58, 61]), (80, [2, 40, 77, 80])])
def test_layer_ids_follow_vllm_serving(layers, expected):
    assert derive_layer_ids(layers) == expected


@pytest.mark.parametrize("layers", [3, 4, 5, 6])
def test_layer_ids_of_shallow_targets_stay_distinct_and_end_with_the_final_layer(layers):
    ids = derive_layer_ids(layers)
    assert len(set(ids)) == 4 and ids[-1] == layers and max(ids[:-1]) < layers and min(ids) >= 0


def test_the_tiny_target_uses_the_layers_that_train_on_cpu():
    assert derive_layer_ids(4) == [1, 2, 3, 4]


def test_multimodal_wrappers_are_read_through_text_config():
    wrapper = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {"num_hidden_layers": 61}}
    assert text_config(wrapper)["num_hidden_layers"] == 61
    assert text_config({"num_hidden_layers": 4}) == {"num_hidden_layers": 4}


def test_config_hash_ignores_key_order_and_sees_values():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


def test_a_bad_value_is_one_line_naming_file_and_key(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECOPS_WORKDIR", str(tmp_path))
    path = write_config(tmp_path, "model: m\ndata: d.jsonl\ndraft:\n  vocab_size: 0\n")
    with pytest.raises(BadInput) as caught:
        load_run_config(path)
    assert str(caught.value) == "runs/bad.yaml: draft.vocab_size: must be > 0"


def test_a_missing_required_key_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECOPS_WORKDIR", str(tmp_path))
    with pytest.raises(BadInput, match=r"^runs/bad.yaml: data: required key is missing$"):
        load_run_config(write_config(tmp_path, "model: m\n"))


def test_layer_ids_must_be_distinct(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECOPS_WORKDIR", str(tmp_path))
    with pytest.raises(BadInput, match=r"^runs/bad.yaml: layer_ids: must be distinct$"):
        load_run_config(write_config(tmp_path, "model: m\ndata: d.jsonl\nlayer_ids: [1, 1, 4]\n"))


@pytest.mark.parametrize(("text", "message"), [
    ("model: m\ndata: d.jsonl\nlayers: [1, 2]\n", "runs/bad.yaml: layers: unknown key"),
    ("model: m\ndata: d.jsonl\nmax_seq_len: long\n", "runs/bad.yaml: max_seq_len: must be a valid integer"),
])
def test_the_agent_rejects_bad_configs_with_exit_2_and_one_line(tmp_path, text, message):
    write_config(tmp_path, text)
    code, document, _ = agent(tmp_path, "run", "show", "--run", "bad")
    assert code == 2
    assert document["error"].startswith(message)
    assert "\n" not in document["error"]


def test_run_show_reports_derived_layer_ids_and_paths(tiny_workdir, tmp_path):
    root = tmp_path / "w"
    shutil.copytree(tiny_workdir, root)
    code, document, _ = agent(root, "run", "show", "--run", "tiny")
    assert code == 0
    assert document["derived"]["layer_ids"] == [1, 2, 3, 4]
    assert document["derived"]["paths"]["hidden_states"] == str(root / "runs" / "tiny" / "hidden_states")
    assert document["config"]["max_seq_len"] == 256
