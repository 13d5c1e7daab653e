"""What the quantization checks share (doctor/_quantization.py for transformers and the verifier,
doctor/_quantization_vllm.py for the serve env): the target's `quantization_config` read into one shape, and the
small readers of installed source files they both use. Nothing imported of what is read."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from specops.analysis import ModuleIndex
from specops.host.installed import distributions, normalise

AUTO_QUANTIZERS = "transformers.quantizers.auto"
IMPORT_UTILS = "transformers.utils.import_utils"
CT_FORMATS = "compressed_tensors.config.base"
VLLM_QUANT = "vllm.model_executor.layers.quantization"
VLLM_CPU = "vllm.platforms.cpu"
CHECK = "quantization"
# the verifier's parts speculators reads as plain tensors (its embeddings and LM head)
VERIFIER_PARTS = ("embed_tokens", "lm_head")


@dataclass(frozen=True)
class Quantization:
    """A target's quantization_config, as the doctor reads it."""

    method: str                       # quant_method: compressed-tensors, fp8, modelopt, ...
    source: str                       # the config.json it was read from
    format: str | None = None         # compressed-tensors' format (pack-quantized, nvfp4-pack-quantized, ...)
    algo: str | None = None           # modelopt's quant_algo (FP8, NVFP4)
    ignore: tuple[str, ...] = ()      # modules left unquantized
    targets: tuple[str, ...] = ()     # what the config groups quantize (class names or re: patterns)
    schemes: tuple[str, ...] = field(default_factory=tuple)  # e.g. "int4 g32 symmetric"

    @property
    def label(self) -> str:
        kind = self.format or self.algo
        return f"{self.method}" + (f" {kind}" if kind else "") + (f" ({', '.join(self.schemes)})" if self.schemes
                                                                    else "")


def read_quantization(config: dict[str, Any], source: str) -> Quantization | None:
    """The config's quantization_config (a wrapper's text_config's, else its own); None when unquantized."""
    inner = config.get("text_config")
    raw = config.get("quantization_config")
    if not isinstance(raw, dict) and isinstance(inner, dict):
        raw = inner.get("quantization_config")
    if not isinstance(raw, dict):
        return None
    method = str(raw.get("quant_method") or "").strip()
    if not method:
        return None
    nested = raw.get("quantization") if isinstance(raw.get("quantization"), dict) else {}
    algo = raw.get("quant_algo") or nested.get("quant_algo")
    ignore = raw.get("ignore") or raw.get("modules_to_not_convert") or raw.get("exclude_modules") \
        or nested.get("exclude_modules") or []
    targets: list[str] = []
    schemes: list[str] = []
    groups = raw.get("config_groups")
    for group in groups.values() if isinstance(groups, dict) else ():
        if not isinstance(group, dict):
            continue
        targets.extend(str(t) for t in group.get("targets") or [])
        weights = group.get("weights") if isinstance(group.get("weights"), dict) else {}
        if weights:
            bits, kind = weights.get("num_bits"), weights.get("type") or "int"
            size = weights.get("group_size")
            schemes.append(f"{kind}{bits}" + (f" g{size}" if size else "")
                           + (" symmetric" if weights.get("symmetric") else ""))
    if method == "fp8" and raw.get("weight_block_size"):
        schemes.append("block " + "x".join(str(n) for n in raw["weight_block_size"]))
    return Quantization(method, source, raw.get("format") if isinstance(raw.get("format"), str) else None,
                        str(algo) if algo else None, tuple(str(p) for p in ignore if isinstance(p, str)),
                        tuple(targets), tuple(schemes))


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return name == pattern or name.endswith("." + pattern)


# ---------------------------------------------------------------- reading installed sources

def _tree(index: ModuleIndex, module: str) -> tuple[ast.Module, str] | None:
    file = index.module_file(module)
    tree = index.tree(file) if file is not None else None
    return (tree, index.relative_path(module)) if tree is not None else None


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _function(tree: ast.AST, name: str) -> ast.FunctionDef | None:
    return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _class(tree: ast.AST, name: str) -> ast.ClassDef | None:
    return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level NAME = "text" assignments."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def _imported_from(index: ModuleIndex, tree: ast.Module, name: str, module: str) -> str | None:
    """The module `name` is imported from in `module`'s `tree` (relative imports resolved as Python does)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(alias.name == name for alias in node.names):
            base = module.split(".")
            if node.level:
                base = base[:len(base) - node.level + (1 if index.is_package(module) else 0)]
                return ".".join([*base, node.module] if node.module else base)
            return node.module
    return None


def _dict_at(tree: ast.Module, name: str) -> tuple[dict[str, str], int] | None:
    """A module-level NAME = {"key": Class, ...}: {key: class name}, and its line."""
    for node in ast.walk(tree):
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if isinstance(value, ast.Dict) and any(isinstance(t, ast.Name) and t.id == name for t in targets):
            mapping = {k.value: ast.unparse(v) for k, v in zip(value.keys, value.values, strict=True)
                       if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            return mapping, node.lineno
    return None


def _version(search_path: list[str], package: str) -> str | None:
    found = distributions(search_path).get(normalise(package))
    return found.version if found is not None else None
