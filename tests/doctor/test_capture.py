"""vLLM's numbering of the auxiliary hidden states a target model captures for EAGLE-3, read from the installed
model's forward (doctor/_capture.py): DeepseekV2Model (DeepSeek-V3, Kimi-K2's text model) captures id i
entering layer i and id n after the last layer, as Llama does; a DeepseekV2Model without the final-layer capture
(vLLM before 0.25, #48124) or one capturing after the layer is told apart; the parity gate's rows say both."""

from __future__ import annotations

import ast

import pytest

from specops.analysis import ModuleIndex
from specops.doctor import aux_capture, interpreter_path
from specops.doctor._capture import read_forward
from specops.pipeline.parity.checks import Trained, capture_rows
from tests.support.vllm import VLLM_PYTHON, needs_vllm

FINAL = """        if self.end_layer in self.aux_hidden_state_layers:
            aux_hidden_states.append(hidden_states + residual)
"""


@pytest.fixture(scope="module")
def index() -> ModuleIndex:
    return ModuleIndex(interpreter_path(str(VLLM_PYTHON)))


def _forward(index: ModuleIndex, edit: tuple[str, str] | None = None) -> tuple[bool | None, bool | None, str]:
    file = index.module_file("vllm.model_executor.models.deepseek_v2")
    text = file.read_text()
    if edit is not None:
        assert text.count(edit[0]) == 1
        text = text.replace(*edit)
    tree = ast.parse(text)
    model = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "DeepseekV2Model")
    forward = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    found = read_forward(forward, "deepseek_v2.py")
    assert found is not None
    return found


@needs_vllm
def test_deepseek_and_llama_number_alike_with_the_final_layer(index: ModuleIndex) -> None:
    for architecture, model in (("DeepseekV3ForCausalLM", "DeepseekV2Model"), ("LlamaForCausalLM", "LlamaModel")):
        capture = aux_capture(index, architecture)
        assert (capture.model_class, capture.entering, capture.final) == (model, True, True), capture
    trained = Trained([1, 2, 3], "the manifest", 4, 576, 256, "DeepseekV3ForCausalLM", extracted_by="vllm",
                      final_layer=True)
    rows = capture_rows(trained, aux_capture(index, "DeepseekV3ForCausalLM"), "vLLM 0.32.0")
    assert [(row["key"], row["ok"]) for row in rows] == [("auxiliary layer numbering", True),
                                                         ("final layer captured", True)]


@needs_vllm
def test_a_model_without_the_final_capture_or_capturing_after_the_layer_is_told(index: ModuleIndex) -> None:
    assert _forward(index)[:2] == (True, True)
    assert _forward(index, (FINAL, ""))[:2] == (True, False)  # vLLM < 0.25: id n never captured
    call = ("            hidden_states, residual = layer(\n"
            "                positions, hidden_states, residual, llama_4_scaling\n            )\n")
    assert _forward(index, (call, ""))[0] is None  # no layer call found: not read, never "ok"
    trained = Trained([1, 2, 3], "the manifest", 4, 576, 256, "DeepseekV3ForCausalLM", extracted_by="vllm",
                      final_layer=True)
    from specops.doctor import Capture

    (numbering, final) = capture_rows(trained, Capture("DeepseekV2Model", True, False, "deepseek_v2.py:1561"), "v")
    assert numbering["ok"] and not final["ok"] and "#48124" in final["serving"]
