"""The target's `quantization_config`, judged before any load for every env that loads the target.

A target is stored as it was published (Kimi-K2.5's int4 compressed-tensors experts, FP8, NVFP4); every env
that loads it needs the format's package at a version that reads the format, and the method must run on that
env's build and this host's hardware. Read from the installed files, never imported:

- transformers (the run's env: the hf backend's regenerate, extract, validate, evaluate): the quantizer its
  `AUTO_QUANTIZER_MAPPING` (quantizers/auto.py) gives the method, and that quantizer's `validate_environment`:
  the packages it asks for (`is_X_available`, the minimum version from utils/import_utils.py), what it refuses
  (pre-quantized checkpoints), what it needs of the hardware (a CUDA GPU, a compute capability) and where it
  dequantizes instead; for compressed-tensors, the formats the installed package's `CompressionFormat` names;
- vLLM (the serve env): the methods its quantization registry knows (`QuantizationMethods`), the ones its CPU
  platform serves (`supported_quantization`), the config class's `get_min_capability` against the GPUs'
  compute capability and its `get_supported_act_dtypes` against the dtype the server computes in;
- speculators' trainer (and the fidelity check) reads the verifier's embeddings and `lm_head` as plain
  tensors: they must be stored unquantized (the config's `ignore`, the checkpoint's tensor names).

GGUF targets are written as plain weights first (pipeline/data/gguf.py): their folder has no quantization_config.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from specops.analysis import ModuleIndex
from specops.doctor._model import read_json
from specops.doctor._quantization_read import (  # noqa: F401  (re-exported: the doctor's face reads them here)
    AUTO_QUANTIZERS,
    CHECK,
    CT_FORMATS,
    IMPORT_UTILS,
    VERIFIER_PARTS,
    VLLM_CPU,
    VLLM_QUANT,
    Quantization,
    _class,
    _dict_at,
    _function,
    _imported_from,
    _matches,
    _module_strings,
    _strings,
    _tree,
    _version,
    read_quantization,
)
from specops.doctor._quantization_vllm import vllm_items
from specops.doctor._report import Item, at_least
from specops.doctor._weights import weight_names
from specops.doctor.settings import RunSettings
from specops.host.gpus import compute_capability, device_count
from specops.planning import hidden_state_dtype

# ---------------------------------------------------------------- transformers (the run's env)

@dataclass(frozen=True)
class Requirement:
    package: str            # the import name transformers looks for
    minimum: str | None
    where: str              # quantizer file:line


@dataclass
class HfReading:
    """What transformers' quantizer for a method asks before it loads."""

    quantizer: str | None = None
    where: str = ""
    requires: list[Requirement] = field(default_factory=list)
    refuses_prequantized: str | None = None   # its message, where it refuses a published checkpoint
    needs_cuda: str | None = None             # file:line where it raises without a CUDA GPU
    cpu_dequantizes: bool = False             # without a GPU it dequantizes instead of raising
    min_capability: tuple[int, str, bool] | None = None  # (sm as 10*major, file:line, raises below it)


def _availability(index: ModuleIndex, function: str) -> tuple[str, str | None] | None:
    """(import name, minimum version) an `is_X_available` of transformers' import_utils checks."""
    found = _tree(index, IMPORT_UTILS)
    if found is None:
        return None
    tree, _where = found
    node = _function(tree, function)
    if node is None:
        return None
    constants = _module_strings(tree)
    minimum = None
    for arg, default in zip(reversed(node.args.args), reversed(node.args.defaults), strict=False):
        if arg.arg == "min_version":
            minimum = constants.get(default.id) if isinstance(default, ast.Name) else (
                default.value if isinstance(default, ast.Constant) else None)
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and ast.unparse(call.func).endswith("_is_package_available") and call.args \
                and isinstance(call.args[0], ast.Constant):
            return str(call.args[0].value), minimum
    return None


def read_hf(index: ModuleIndex, method: str) -> HfReading | None:
    """transformers' quantizer for `method`, read from quantizers/auto.py and its own file; None without
    transformers; a reading with no quantizer when transformers knows no such method."""
    found = _tree(index, AUTO_QUANTIZERS)
    if found is None:
        return None
    tree, where = found
    mapping = _dict_at(tree, "AUTO_QUANTIZER_MAPPING")
    if mapping is None:
        return None
    classes, line = mapping
    reading = HfReading(where=f"{where}:{line}")
    class_name = classes.get(method)
    if class_name is None:
        return reading
    reading.quantizer = class_name
    module = _imported_from(index, tree, class_name, AUTO_QUANTIZERS)
    own = _tree(index, module) if module else None
    if own is None:
        return reading
    own_tree, own_where = own
    validate = _function(_class(own_tree, class_name) or own_tree, "validate_environment")
    if validate is None:
        return reading
    _read_validate(index, validate, own_where, reading)
    return reading


def _raises(body: list[ast.stmt]) -> bool:
    return any(isinstance(statement, ast.Raise) for statement in body)


def _sets_dequantize(body: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Assign) and any(ast.unparse(t).endswith("dequantize") for t in n.targets)
               for statement in body for n in ast.walk(statement))


def _read_validate(index: ModuleIndex, validate: ast.FunctionDef, where: str, reading: HfReading) -> None:
    for node in ast.walk(validate):
        if not isinstance(node, ast.If):
            continue
        test = ast.unparse(node.test)
        at = f"{where}:{node.lineno}"
        for call in ast.walk(node.test):
            name = ast.unparse(call.func) if isinstance(call, ast.Call) else ""
            if re.fullmatch(r"is_\w+_available", name) and name != "is_torch_xpu_available" and _raises(node.body):
                needed = _availability(index, name)
                if needed is not None:
                    reading.requires.append(Requirement(needed[0], needed[1], at))
        if "pre_quantized" in test and not test.startswith("not ") and _raises(node.body):
            raised = next(n for n in node.body if isinstance(n, ast.Raise))
            reading.refuses_prequantized = f"{' '.join(_strings(raised))} ({at})"
        if "cuda.is_available" in test and test.startswith("not "):
            if _sets_dequantize(node.body):
                reading.cpu_dequantizes = True
            elif _raises(node.body) and reading.needs_cuda is None:
                reading.needs_cuda = at
        if re.search(r"\bmajor\s*<\s*\d+", test):
            numbers = [int(n) for n in re.findall(r"major\s*<\s*(\d+)", test)]
            minor = re.search(r"minor\s*<\s*(\d+)", test)
            sm = numbers[0] * 10 + (int(minor.group(1)) if minor and len(numbers) > 1 else 0)
            reading.min_capability = (sm, at, _raises(node.body) and not _sets_dequantize(node.body))


def _ct_formats(index: ModuleIndex) -> tuple[list[str], str] | None:
    """The formats the installed compressed-tensors reads (its CompressionFormat enum's values)."""
    found = _tree(index, CT_FORMATS)
    if found is None:
        return None
    tree, where = found
    enum = _class(tree, "CompressionFormat")
    if enum is None:
        return None
    values = [n.value.value for n in enum.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
              and isinstance(n.value.value, str)]
    return values, f"{where}:{enum.lineno}"


def _pip(python: str | None, package: str, minimum: str | None) -> str:
    spec = f"{package}>={minimum}" if minimum else package
    return f"{python or 'python'} -m pip install '{spec}'"


def hf_items(quant: Quantization, index: ModuleIndex, *, loads: bool, gpus: int, capability: int | None,
             python: str | None) -> list[Item]:
    """Whether the run's env's transformers loads the quantized target here. `loads`: this env loads it whole
    (the hf backend); else a break is a warning (only an hf replay would load it)."""
    bad = "error" if loads else "warn"
    reading = read_hf(index, quant.method)
    if reading is None:
        return []  # no transformers here: the model check says so
    transformers = _version(index.search_path, "transformers")
    if reading.quantizer is None:
        return [Item(CHECK, bad, reading.where, f"{quant.source}: quant_method {quant.method!r}: transformers "
                     f"{transformers} has no quantizer for it (AUTO_QUANTIZER_MAPPING): the hf backend cannot load "
                     "this target", "serve it with the vllm backend (backend: vllm) on hardware that runs it")]
    if reading.refuses_prequantized:
        return [Item(CHECK, bad, quant.source, f"quant_method {quant.method!r}: transformers {transformers}'s "
                     f"{reading.quantizer} refuses a published checkpoint: {reading.refuses_prequantized}",
                     "serve it with the vllm backend (backend: vllm) on hardware that runs it")]
    for need in reading.requires:
        have = _version(index.search_path, need.package)
        if have is None or (need.minimum and not at_least(have, need.minimum)):
            found = f"{need.package.replace('_', '-')} {have} is installed" if have else \
                f"{need.package.replace('_', '-')} is not installed"
            return [Item(CHECK, bad, need.where, f"{quant.source}: {quant.label}: transformers {transformers} loads "
                         f"it only with {need.package.replace('_', '-')}>={need.minimum or 'any'} "
                         f"({reading.quantizer}); {found} in this env",
                         _pip(python, need.package.replace("_", "-"), need.minimum))]
    if reading.needs_cuda and gpus == 0:
        return [Item(CHECK, bad, reading.needs_cuda, f"{quant.source}: {quant.label}: transformers "
                     f"{transformers}'s {reading.quantizer} needs a CUDA GPU; this host has none",
                     "run on a GPU host, or serve it with the vllm backend where vLLM runs it")]
    if reading.min_capability and gpus and capability is not None and capability < reading.min_capability[0]:
        sm, at, raises = reading.min_capability
        if raises:
            return [Item(CHECK, bad, at, f"{quant.source}: {quant.label}: transformers' {reading.quantizer} needs "
                         f"compute capability >= {sm / 10:.1f}; this host's GPUs are {capability / 10:.1f}",
                         "run on GPUs that have it, or serve it with the vllm backend where vLLM runs it")]
    items: list[Item] = []
    if quant.method == "compressed-tensors" and quant.format:
        formats = _ct_formats(index)
        if formats is not None and quant.format not in formats[0]:
            version = _version(index.search_path, "compressed-tensors")
            return [Item(CHECK, bad, formats[1], f"{quant.source}: format {quant.format!r}: compressed-tensors "
                         f"{version} reads only {', '.join(formats[0])}", _pip(python, "compressed-tensors", None)
                         + " --upgrade")]
    how = "dequantized to the compute dtype on this CPU host" if gpus == 0 and reading.cpu_dequantizes else \
        "its weights decompressed on load or first use"
    packages = ", ".join(f"{n.package.replace('_', '-')} {_version(index.search_path, n.package)}"
                         for n in reading.requires) or "no extra package"
    items.append(Item(CHECK, "ok", quant.source, f"{quant.label}: transformers {transformers} loads it through "
                      f"{reading.quantizer} ({packages}; {how})"))
    return items


# ---------------------------------------------------------------- the trainer's needs of the verifier

def verifier_items(quant: Quantization, names: list[str] | None, tied: bool) -> list[Item]:
    """speculators reads the verifier's embeddings and lm_head as plain tensors: stored unquantized."""
    quantised: list[str] = []
    for part in VERIFIER_PARTS:
        if names is not None:
            stored = [n for n in names if re.search(rf"(^|\.){part}\.", n)]
            if not stored and part == "lm_head" and tied:
                continue
            # a quantized part stores more than its weight (packs, scales, shapes: weight_scale_inv, ...)
            if not any(n.endswith(f"{part}.weight") for n in stored) or any(
                    not n.endswith((".weight", ".bias")) for n in stored):
                quantised.append(f"{part} ({', '.join(sorted(stored)[:3]) or 'not stored'})")
        elif part == "lm_head" and quant.targets and any(t in ("Linear", "re:.*") for t in quant.targets) \
                and not any(_matches("lm_head", p) for p in quant.ignore):
            quantised.append("lm_head (a Linear the config quantizes: not in ignore)")
    if quantised:
        return [Item(CHECK, "error", quant.source, f"{quant.label}: speculators' trainer reads the verifier's "
                     f"embeddings and lm_head as plain tensors; stored quantized here: {'; '.join(quantised)}",
                     "use a checkpoint that leaves embed_tokens and lm_head unquantized (quantization_config ignore)")]
    ignored = ", ".join(quant.ignore[:4]) + (" ..." if len(quant.ignore) > 4 else "")
    return [Item(CHECK, "ok", quant.source, f"{quant.label}: the verifier's embeddings and lm_head are stored "
                 f"unquantized (ignore: {ignored or 'none'}): speculators' trainer reads them as they are")]


def breaks(items: list[Item]) -> list[Item]:
    """The quantization items that stop a run before its first load."""
    return [item for item in items if item.check == CHECK and item.result == "error"]



def target_items(settings: RunSettings, index: ModuleIndex, serving: ModuleIndex | None, platform: str,
                 *, loads_hf: bool | None = None) -> list[Item]:
    """The run's target's quantization judged for the envs that load it: the run's env (transformers; a break is
    an error where `loads_hf`, by default the hf backend) and, with the vllm backend, the serve env (`serving`)."""
    if not settings.model_path:
        return []
    model = Path(settings.model_path)
    config = read_json(model / "config.json") if model.is_dir() else None
    if config is None:
        return []
    quant = read_quantization(config, str(model / "config.json"))
    if quant is None:
        return []
    gpus = settings.gpus if settings.gpus is not None else device_count()
    capability = settings.compute_capability if settings.compute_capability is not None else (
        compute_capability() if gpus else None)
    names = weight_names(model)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    tied = bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings")))
    items = hf_items(quant, index, loads=settings.backend == "hf" if loads_hf is None else loads_hf, gpus=gpus,
                     capability=capability, python=sys.executable)
    if settings.backend == "vllm" and serving is not None:
        items += vllm_items(quant, serving, platform=platform, capability=capability,
                            serve_dtype=hidden_state_dtype(settings.dtype, platform == "gpu"))
    return items + verifier_items(quant, names[0] if names else None, tied)


def refusal(items: list[Item]) -> str | None:
    """The one line that stops a run before its first load: the first break and the command that mends it."""
    found = breaks(items)
    if not found:
        return None
    item = found[0]
    return f"{item.why} ({item.where}); mend: {item.fix}" if item.fix else f"{item.why} ({item.where})"
