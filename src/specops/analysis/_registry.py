"""vLLM's model registry read from its source: architecture name -> (module, class) dict literals."""

from __future__ import annotations

import ast

from specops.analysis._index import DefTarget, ModuleIndex

REGISTRY = "vllm.model_executor.models.registry"
MODELS_PACKAGE = "vllm.model_executor.models"
# Without a run, a package's model hooks are judged against these decoder families (those present).
COMMON_ARCHITECTURES = ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM")


def registry_entries(index: ModuleIndex) -> dict[str, tuple[str, str]]:
    """{architecture: (module under vllm.model_executor.models, class name)} from every dict literal."""
    cached = getattr(index, "_registry_entries", None)
    if cached is not None:
        return cached
    entries: dict[str, tuple[str, str]] = {}
    file = index.module_file(REGISTRY)
    tree = index.tree(file) if file is not None else None
    for node in ast.walk(tree) if tree is not None else ():
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if (isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Tuple)
                    and len(value.elts) == 2 and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                                     for e in value.elts)):
                entries.setdefault(key.value, (value.elts[0].value, value.elts[1].value))  # type: ignore[attr-defined]
    index._registry_entries = entries  # type: ignore[attr-defined]
    return entries


def registry_class(index: ModuleIndex, architecture: str) -> DefTarget | None:
    entry = registry_entries(index).get(architecture)
    if entry is None:
        return None
    target = index.resolve(f"{MODELS_PACKAGE}.{entry[0]}.{entry[1]}")
    return target if isinstance(target, DefTarget) and target.is_class else None


def common_architectures(index: ModuleIndex) -> list[str]:
    entries = registry_entries(index)
    return [name for name in COMMON_ARCHITECTURES if name in entries]
