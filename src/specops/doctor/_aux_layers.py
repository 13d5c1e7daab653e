"""How many auxiliary hidden states the installed vLLM's EAGLE-3 draft takes, read from its own model file.

The draft's first layer (`fc`) concatenates the target's auxiliary hidden states: vLLM up to 0.16 sizes it
`hidden_size * 3` whatever the draft was trained on (vLLM #54526: a draft trained on 4 auxiliary layers fails
at load with a shape mismatch); later releases size it from the draft config's
`eagle_aux_hidden_state_layer_ids` (3 where the config has none: vLLM #50170, then the target's default layers
are captured silently, acceptance 1.04 instead of 2.77). The class is found through vLLM's model registry
(the eagle3 architecture speculators writes), not a fixed file name.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from specops.analysis import ModuleIndex
from specops.doctor._capabilities import architecture_class
from specops.doctor._report import Item

DRAFT_ARCHITECTURE = "Eagle3LlamaForCausalLM"  # what speculators' eagle3 checkpoints name (config.architectures)


@dataclass(frozen=True)
class AuxRule:
    fixed: int | None       # the only count the draft takes (vLLM <= 0.16: 3); None: from the draft config
    default: int | None     # the count taken when the config names no layers
    where: str


def aux_rule(index: ModuleIndex) -> AuxRule | None:
    """The rule of the installed vLLM's EAGLE-3 draft model; None where its file cannot be read."""
    mapped = architecture_class(index, DRAFT_ARCHITECTURE)
    if mapped is None:
        return None
    module = f"vllm.model_executor.models.{mapped[0]}"
    file = index.module_file(module)
    tree = index.tree(file) if file is not None else None
    if tree is None:
        return None
    where = index.relative_path(module)
    from_config = "eagle_aux_hidden_state_layer_ids" in (index.text(file) or "") and any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len"
        and "layer_ids" in ast.unparse(node) for node in ast.walk(tree))
    fixed = None
    for node in ast.walk(tree):
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and isinstance(node.right, ast.Constant)
                and isinstance(node.right.value, int) and "hidden_size" in ast.unparse(node.left)):
            fixed = node.right.value
            where = f"{where}:{node.lineno}"
            break
    if from_config:
        default = next((node.orelse.value for node in ast.walk(tree) if isinstance(node, ast.IfExp)
                        and "layer_ids" in ast.unparse(node.test) and isinstance(node.orelse, ast.Constant)), None)
        return AuxRule(None, default if isinstance(default, int) else None, where)
    return AuxRule(fixed, fixed, where) if fixed is not None else None


def aux_items(index: ModuleIndex, version: str | None, layer_ids: list[int] | None, layers: int | None) -> list[Item]:
    """The run's auxiliary layers (its layer ids but the final one) against what the serving vLLM's draft takes."""
    if not layer_ids:
        return []
    rule = aux_rule(index)
    aux = [i for i in layer_ids if layers is None or i != layers]
    if rule is None:
        return [Item("serving", "unknown", "eagle3 draft", f"vLLM {version}: could not read how many auxiliary "
                     "hidden states its EAGLE-3 draft takes", "serve a draft once before training at scale")]
    if rule.fixed is not None and len(aux) != rule.fixed:
        return [Item("serving", "error", rule.where, f"vLLM {version}'s EAGLE-3 draft takes exactly {rule.fixed} "
                     f"auxiliary hidden states; the run trains on {len(aux)} ({aux}): the trained draft fails "
                     "at load (vLLM #54526)", f"train on {rule.fixed} auxiliary layers, or serve with a vLLM that "
                     "sizes the draft from its config (0.17 and later)")]
    how = (f"exactly {rule.fixed}" if rule.fixed is not None else
           f"as many as the draft config's eagle_aux_hidden_state_layer_ids (none: {rule.default})")
    return [Item("serving", "ok", rule.where, f"vLLM {version}'s EAGLE-3 draft takes {how}; the run trains on "
                 f"{len(aux)} ({aux})")]
