"""`draft.method`: the kind of draft a run trains (issue 52), without training: the run config's key and the
settings of each kind, speculators' own flags for it, and vLLM's --speculative-config for a draft of any kind."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from specops.contract.errors import BadInput
from specops.pipeline.run.config import load_run_config
from specops.pipeline.training.command import TrainPlan, build_train_command
from specops.pipeline.vllm import serving_config, speculative_config

PLAN = TrainPlan(
    verifier="/m/Llama", data_path=Path("/r/prepared"), hidden_states_path=Path("/r/hidden_states"),
    save_path=Path("/r/checkpoints"), target_layer_ids=(2, 16, 29), draft_vocab_size=32000,
    d2t_path=Path("/r/vocab/d2t-32000.npy"), t2d_path=Path("/r/vocab/t2d-32000.npy"), num_layers=1, epochs=5,
)


def flag(command: list[str], name: str) -> list[str]:
    start = command.index(name) + 1
    end = next((i for i in range(start, len(command)) if command[i].startswith("--")), len(command))
    return command[start:end]


def test_an_eagle3_plan_keeps_the_argv_it_always_had() -> None:
    command = build_train_command(PLAN, gpus=1)
    assert "--speculator-type" not in command and "--hidden-states-dtype" not in command
    assert flag(command, "--num-layers") == ["1"]


def test_a_dflash_plan_passes_speculators_own_flags_for_the_kind() -> None:
    dflash = replace(PLAN, speculator_type="dflash", block_size=8, num_layers=None)
    on_gpu = build_train_command(dflash, gpus=1)
    assert flag(on_gpu, "--speculator-type") == ["dflash"] and flag(on_gpu, "--block-size") == ["8"]
    assert "--num-layers" not in on_gpu  # speculators' own default depth for the kind (5)
    assert flag(on_gpu, "--d2t-path") == ["/r/vocab/d2t-32000.npy"]  # the block kinds map a draft vocabulary too
    # on a CPU no autocast runs: the hidden states are read as float32 for the fp32 weights
    assert flag(build_train_command(dflash, gpus=0), "--hidden-states-dtype") == ["float32"]


def test_an_mtp_plan_leaves_out_what_speculators_refuses_for_it() -> None:
    mtp = replace(PLAN, speculator_type="mtp", num_layers=None, d2t_path=None, t2d_path=None, num_speculative_steps=2)
    command = build_train_command(mtp, gpus=0)
    assert flag(command, "--speculator-type") == ["mtp"] and flag(command, "--num-speculative-steps") == ["2"]
    for refused in ("--num-layers", "--draft-attn-impl", "--d2t-path", "--draft-vocab-size"):
        assert refused not in command
    with pytest.raises(BadInput, match="mtp draft reuses"):
        build_train_command(replace(mtp, num_layers=1), gpus=0)


def test_a_dflash2_plan_drafts_in_the_target_whole_vocabulary() -> None:
    # speculators 0.9.0 refuses a DFlash2 draft vocabulary smaller than the verifier's
    dflash2 = replace(PLAN, speculator_type="dflash2", num_layers=None, d2t_path=None, t2d_path=None)
    command = build_train_command(dflash2, gpus=0)
    assert "--draft-vocab-size" not in command and "--d2t-path" not in command
    with pytest.raises(BadInput, match="whole vocabulary"):
        build_train_command(replace(dflash2, d2t_path=PLAN.d2t_path, t2d_path=PLAN.t2d_path), gpus=0)


def write_run(tmp_path: Path, draft: dict) -> Path:
    path = tmp_path / "runs" / "k.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"model": "m", "data": "d.jsonl", "draft": draft}))
    return path


def test_draft_method_defaults_to_eagle3_and_takes_each_kind_speculators_names(tmp_path: Path) -> None:
    assert load_run_config(write_run(tmp_path, {})).draft.method == "eagle3"
    config = load_run_config(write_run(tmp_path, {"method": "dflash", "block_size": 4}))
    assert (config.draft.method, config.draft.block_size, config.draft.layers) == ("dflash", 4, 5)


@pytest.mark.parametrize(("draft", "line"), [
    ({"method": "dlfash"}, "draft.method: must be 'eagle3', 'dflash', 'dflash2', 'dspark', 'xpress', 'peagle' or "
                           "'mtp'"),
    ({"block_size": 4}, "draft: block_size is a setting of dflash, dflash2, dspark, xpress drafts, not of method "
                        "eagle3"),
    ({"method": "peagle", "num_speculative_steps": 2}, "draft: num_speculative_steps is a setting of mtp drafts, "
                                                       "not of method peagle"),
    ({"method": "mtp", "num_layers": 1}, "draft: num_layers: an mtp draft reuses the target's own MTP layers"),
])
def test_a_setting_the_kind_does_not_take_is_one_line(tmp_path: Path, draft: dict, line: str) -> None:
    with pytest.raises(BadInput) as caught:
        load_run_config(write_run(tmp_path, draft))
    message = str(caught.value)
    assert message.split("k.yaml: ", 1)[1].startswith(line) and "\n" not in message  # the file, the key, what


def draft_folder(tmp_path: Path, kind: str, tokens: int) -> Path:
    folder = tmp_path / kind
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"speculators_model_type": kind, "speculators_config": {
        "proposal_methods": [{"speculative_tokens": tokens}]}}))
    return folder


def test_each_servable_kind_gets_the_method_vllms_own_loader_gives_it(tmp_path: Path) -> None:
    eagle3 = draft_folder(tmp_path, "eagle3", 3)
    assert speculative_config(eagle3, 3) == {"method": "eagle3", "model": str(eagle3), "num_speculative_tokens": 3}
    dflash = draft_folder(tmp_path, "dflash", 15)
    assert speculative_config(dflash) == {"method": "dflash", "model": str(dflash), "num_speculative_tokens": 15}
    assert serving_config(dflash, 3)["num_speculative_tokens"] == 15  # a block kind drafts its whole block
    assert speculative_config(draft_folder(tmp_path, "dflash2", 7))["method"] == "dflash"
    assert speculative_config(draft_folder(tmp_path, "dspark", 7))["method"] == "dspark"
    peagle = speculative_config(draft_folder(tmp_path, "peagle", 3), 5)
    assert (peagle["method"], peagle["parallel_drafting"], peagle["num_speculative_tokens"]) == ("eagle3", True, 5)
    with pytest.raises(BadInput, match="drafts at most 15 tokens"):
        speculative_config(dflash, 16)


@pytest.mark.parametrize("kind", ["xpress", "mtp"])
def test_a_kind_vllm_does_not_serve_is_one_line(tmp_path: Path, kind: str) -> None:
    with pytest.raises(BadInput, match=f"a {kind} draft: vLLM's speculators loader serves"):
        speculative_config(draft_folder(tmp_path, kind, 3))
