"""How the installed vLLM's model for an architecture numbers the auxiliary hidden states it captures for
EAGLE-3, read from the model's `forward` (nothing imported).

vLLM's numbering: id i is the hidden state ENTERING decoder layer i, id n the output of the last layer before
the final norm. Llama says it as `_maybe_add_hidden_state(aux, idx + 1, ...)` after each layer;
DeepseekV2Model (DeepSeek-V3, Kimi-K2's text model) as `if idx in self.aux_hidden_state_layers` before each
layer and `if self.end_layer in self.aux_hidden_state_layers` after the loop: the final-layer capture, absent
before vLLM 0.25 (vLLM #48124: the hidden states of id n were never written).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from specops.analysis import ModuleIndex
from specops.doctor._capabilities import architecture_class

AUX = "aux_hidden_state_layers"
ADD = "_maybe_add_hidden_state"


@dataclass(frozen=True)
class Capture:
    model_class: str | None  # the class whose forward captures (DeepseekV2Model)
    entering: bool | None    # id i is the state entering layer i (vLLM's numbering)
    final: bool | None       # id n (the last layer's output, before the final norm) is captured
    where: str               # file:line of the capture

    def to_dict(self) -> dict:
        return {"model_class": self.model_class, "entering": self.entering, "final": self.final, "where": self.where}


def _captures(node: ast.stmt) -> tuple[str, int] | None:
    """(the id expression, line) when `node` captures an auxiliary state: `if idx in self.aux_...:` or a call
    of _maybe_add_hidden_state(aux, ID, ...)."""
    if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and AUX in ast.unparse(node.test):
        if isinstance(node.test.ops[0], ast.In):
            return ast.unparse(node.test.left), node.lineno
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and ast.unparse(call.func).endswith(ADD) and len(call.args) >= 2:
            return ast.unparse(call.args[1]), node.lineno
    return None


def _calls_layer(node: ast.stmt, name: str) -> bool:
    return any(isinstance(call, ast.Call) and ast.unparse(call.func) == name for call in ast.walk(node))


def read_forward(function: ast.FunctionDef, file: str) -> tuple[bool | None, bool | None, str] | None:
    """(entering, final, where) of a forward that captures auxiliary states; None when it captures none."""
    loop = next((node for node in ast.walk(function)
                 if isinstance(node, ast.For) and (AUX in ast.unparse(node) or ADD in ast.unparse(node))), None)
    if loop is None:
        return None
    names = [target.id for target in ast.walk(loop.target) if isinstance(target, ast.Name)]
    index, layer = [*names, None, None][:2]
    captured = [(position, found) for position, node in enumerate(loop.body) if (found := _captures(node))]
    called = next((position for position, node in enumerate(loop.body) if layer and _calls_layer(node, layer)), None)
    if not captured or called is None:
        return None, None, f"{file}:{loop.lineno}"
    position, (expression, line) = captured[0]
    entering = ((position < called and expression == index) or (position > called and expression == f"{index} + 1"))
    if position > called and expression == index:
        entering = False
    after = ast.unparse(ast.Module(body=[s for s in function.body if s.lineno > loop.lineno], type_ignores=[]))
    final = f"end_layer in self.{AUX}" in after or (position > called and expression == f"{index} + 1")
    return entering, final, f"{file}:{line}"


def aux_capture(index: ModuleIndex, architecture: str) -> Capture:
    """How the vLLM on `index` numbers the captured states of `architecture`'s model (unknown: None fields)."""
    mapped = architecture_class(index, architecture)
    if mapped is None:
        return Capture(None, None, None, f"vLLM's model registry has no {architecture}")
    module = f"vllm.model_executor.models.{mapped[0]}"
    file = index.module_file(module)
    tree = index.tree(file) if file is not None else None
    for klass in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)) if tree is not None else ():
        for function in klass.body:
            if isinstance(function, ast.FunctionDef) and function.name == "forward":
                found = read_forward(function, index.relative_path(module))
                if found is not None:
                    return Capture(klass.name, *found)
    return Capture(None, None, None, f"{index.relative_path(module)}: no forward of {mapped[1]}'s module captures "
                   "auxiliary states (a wrapper: its language model's module captures)")
