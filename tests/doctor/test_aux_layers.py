"""How many auxiliary hidden states the serving vLLM's EAGLE-3 draft takes, read from its own model file (found
through its registry): vLLM 0.16 sizes the draft's fc for exactly 3 (a draft trained on 4 fails at load, vLLM
#54526), 0.33 for as many as the draft config names. The doctor judges the run's layer ids before anything trains;
the parity gate reads the same rule for a written draft. Real vLLM sources from the 0.16.0 and 0.33.0 wheels."""

from __future__ import annotations

from pathlib import Path

import pytest

from specops.analysis import ModuleIndex
from specops.doctor import aux_rule
from specops.doctor._aux_layers import aux_items
from specops.pipeline.parity.checks import Trained, compare
from specops.pipeline.parity.vllm_reading import read_vllm
from tests.support.wheels import site_with

pytestmark = pytest.mark.wheels

FOUR_AUX = [1, 2, 3, 4, 6]  # four auxiliary layers and the final one of a 6-layer target


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("aux")
    return {version: site_with(root / version, ("vllm", version)) for version in ("0.16.0", "0.33.0")}


def test_the_rule_is_read_from_each_releases_draft_model(sites: dict[str, Path]) -> None:
    old, new = aux_rule(ModuleIndex([str(sites["0.16.0"])])), aux_rule(ModuleIndex([str(sites["0.33.0"])]))
    assert (old.fixed, old.where) == (3, "vllm/model_executor/models/llama_eagle3.py:175")
    assert (new.fixed, new.default) == (None, 3)


def test_a_run_with_four_auxiliary_layers_is_an_error_on_vllm_0_16_before_training(sites: dict[str, Path]) -> None:
    [item] = aux_items(ModuleIndex([str(sites["0.16.0"])]), "0.16.0", FOUR_AUX, 6)
    assert item.result == "error" and "takes exactly 3" in item.why and "trains on 4 ([1, 2, 3, 4])" in item.why
    [item] = aux_items(ModuleIndex([str(sites["0.33.0"])]), "0.33.0", FOUR_AUX, 6)
    assert item.result == "ok" and "as many as the draft config's" in item.why
    [item] = aux_items(ModuleIndex([str(sites["0.16.0"])]), "0.16.0", [1, 2, 3, 6], 6)
    assert item.result == "ok"


def test_the_gate_refuses_a_four_layer_draft_where_vllm_takes_three(sites: dict[str, Path]) -> None:
    config = {"speculators_model_type": "eagle3", "eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4],
              "draft_vocab_size": 64, "transformer_layer_config": {"model_type": "llama", "vocab_size": 128},
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                     "verifier": {"name_or_path": "target", "architectures": ["LlamaForCausalLM"]}}}
    trained = Trained(aux_layers=[1, 2, 3, 4], aux_origin="extraction", target_layers=6, target_vocab=None,
                      draft_vocab=None, architecture=None)
    for version, ok in (("0.16.0", False), ("0.33.0", True)):
        reading = read_vllm(search_path=[str(sites[version])])
        rows = {row["key"]: row for row in compare(config, {}, trained, reading, "eagle3", {}, None)}
        if ok:
            assert "auxiliary layer count" not in rows  # sized from the config: any count loads
        else:
            row = rows["auxiliary layer count"]
            assert (row["training"], row["serving"], row["ok"]) == (4, 3, False) and "#54526" in row["where"]
