"""Which transformers class loads a model folder, read from transformers' own auto mappings.

The mappings (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` and its neighbours) are plain dicts of string pairs
in transformers/models/auto/modeling_auto.py, so a model_type resolves to its class without importing
transformers: the doctor judges a load in milliseconds, and the step that loads the target asks the
same question and gets the same answer. A multimodal wrapper (Kimi-K2.5's `kimi_k25`) is in no causal-LM
mapping, and `AutoModelForCausalLM` refuses it; its generating class is in the image-text-to-text one.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from specops.analysis._index import ModuleIndex

AUTO_MODULE = "transformers.models.auto.modeling_auto"
# The mappings whose classes generate text from token ids, in the order a loader should try them.
GENERATING_MAPPINGS = (
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES",
    "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES",
)


@dataclass(frozen=True)
class AutoClass:
    """How transformers loads a model_type: the class, the mapping holding it and where it is written."""

    model_type: str
    class_name: str | None      # None: no generating mapping knows the model_type
    mapping: str | None
    where: str                  # file:line of the entry (or of the file, when absent)

    @property
    def causal_lm(self) -> bool:
        """AutoModelForCausalLM accepts it."""
        return self.mapping == GENERATING_MAPPINGS[0]


def read_mappings(file: Path, index: ModuleIndex | None = None) -> dict[str, dict[str, tuple[str, int]]]:
    """Every `NAME = OrderedDict([("type", "Class"), ...])` of the file: {NAME: {type: (Class, line)}}
    (parsed once per index when one is given)."""
    tree = index.tree(file) if index is not None else ast.parse(file.read_text(), str(file))
    if tree is None:
        return {}
    mappings: dict[str, dict[str, tuple[str, int]]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        call = node.value
        if not (isinstance(call, ast.Call) and call.args and isinstance(call.args[0], (ast.List, ast.Tuple))):
            continue
        entries: dict[str, tuple[str, int]] = {}
        for pair in call.args[0].elts:
            if not (isinstance(pair, ast.Tuple) and len(pair.elts) == 2):
                continue
            key, value = pair.elts
            if isinstance(value, ast.Tuple) and value.elts:  # ("type", ("ClassA", "ClassB")): the first
                value = value.elts[0]
            if isinstance(key, ast.Constant) and isinstance(value, ast.Constant) and isinstance(value.value, str):
                entries[str(key.value)] = (value.value, pair.lineno)
        if entries:
            mappings[node.targets[0].id] = entries
    return mappings


def resolve_auto_class(model_type: str, index: ModuleIndex | None = None) -> AutoClass | None:
    """The generating class transformers has for model_type; None when transformers is not installed
    here (nothing to judge)."""
    index = index or ModuleIndex()
    file = index.module_file(AUTO_MODULE)
    if file is None:
        return None
    mappings = read_mappings(file, index)
    for name in GENERATING_MAPPINGS:
        found = mappings.get(name, {}).get(model_type)
        if found is not None:
            return AutoClass(model_type, found[0], name, f"{file}:{found[1]}")
    return AutoClass(model_type, None, None, str(file))


def base_model_class(model_type: str, index: ModuleIndex | None = None) -> str | None:
    """The bare model class (`MODEL_MAPPING_NAMES`) of model_type: what `AutoModel.from_config` builds
    for a wrapper's text_config."""
    index = index or ModuleIndex()
    file = index.module_file(AUTO_MODULE)
    if file is None:
        return None
    found = read_mappings(file, index).get("MODEL_MAPPING_NAMES", {}).get(model_type)
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------------
# Which class loads a target folder: the one decision the loader (pipeline/target.py) and the doctor read


@dataclass(frozen=True)
class TargetLoad:
    """How the pipeline's transformers loader loads a model folder, from its config.json alone."""

    class_name: str | None     # the transformers attribute to call from_pretrained on; None: nothing loads it
    where: str                 # the mapping entry (file:line), or config.json's auto_map
    remote: bool               # the model's own code (auto_map), trusted by the run
    problem: str | None        # why it cannot load; None when it can
    auto: AutoClass | None     # what transformers' auto mappings say of the model_type


def target_load(config: dict, trust_remote_code: bool, index: ModuleIndex | None = None) -> TargetLoad | None:
    """The class that loads the target: the model's own remote code when it ships one for causal LM
    (auto_map) and the run trusts it, else the model_type's generating class from transformers' auto
    mappings — a multimodal wrapper's own class, never AutoModelForCausalLM, which refuses it. None when
    transformers is not installed (nothing to judge)."""
    auto_map = config.get("auto_map") or {}
    if trust_remote_code and isinstance(auto_map, dict) and "AutoModelForCausalLM" in auto_map:
        return TargetLoad("AutoModelForCausalLM", f"config.json auto_map: {auto_map['AutoModelForCausalLM']}",
                          True, None, None)
    model_type = str(config.get("model_type"))
    found = resolve_auto_class(model_type, index)
    if found is None:
        return None
    if found.class_name is None:
        return TargetLoad(None, found.where, False, (
            f"model_type: {model_type!r} has no class that generates text in transformers' auto mappings "
            f"({found.where}); give the model remote code (auto_map) and set trust_remote_code, or upgrade "
            "transformers"), found)
    return TargetLoad(found.class_name, found.where, False, None, found)


def text_model_type(config: dict, index: ModuleIndex | None = None) -> str | None:
    """The model_type transformers builds a wrapper's text model as: text_config's own when transformers
    knows it, else the one whose causal-LM class text_config names in `architectures` (Kimi's `kimi_k2`
    is built as `deepseek_v3`, its DeepseekV3ForCausalLM)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    index = index or ModuleIndex()
    file = index.module_file(AUTO_MODULE)
    if file is None:
        return None
    mappings = read_mappings(file, index)
    model_type = text.get("model_type")
    if model_type in mappings.get("MODEL_MAPPING_NAMES", {}):
        return str(model_type)
    named = set(text.get("architectures") or [])
    for candidate, (class_name, _line) in mappings.get(GENERATING_MAPPINGS[0], {}).items():
        if class_name in named and candidate in mappings.get("MODEL_MAPPING_NAMES", {}):
            return candidate
    return None


@dataclass(frozen=True)
class LanguageModel:
    """Where a loaded target keeps its text model: the attribute path from the top class and its class."""

    path: str                  # "model.language_model" (Kimi-K2.5's wrapper), "model" (a plain causal LM)
    class_name: str            # the text model's bare class (DeepseekV3Model)
    where: str                 # file:line of the assignment that makes it


def language_model(top_class: str, model_type: str, text_type: str | None,
                   index: ModuleIndex | None = None) -> LanguageModel | None:
    """The text model's path inside `top_class`, read from the `__init__` assignments of its modeling file
    (`self.model = Kimi_K25Model(config)`, then `self.language_model = AutoModel.from_config(config.text_config)`,
    whose class is the text model_type's bare model); None when it cannot be followed."""
    index = index or ModuleIndex()
    folder = model_type.replace("-", "_")
    module = f"transformers.models.{folder}.modeling_{folder}"
    if index.module_file(module) is None:
        return None
    bare = base_model_class(text_type, index) if text_type else None
    return _follow(index, module, top_class, bare, "", 0)


def _init_assignments(index: ModuleIndex, module: str, class_name: str) -> list[tuple[str, ast.Call, int]]:
    file = index.module_file(module)
    tree = index.tree(file) if file is not None else None
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            found = []
            for statement in ast.walk(init) if init is not None else ():
                if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                        and isinstance(statement.targets[0], ast.Attribute)
                        and isinstance(statement.targets[0].value, ast.Name) and statement.targets[0].value.id == "self"
                        and isinstance(statement.value, ast.Call)):
                    found.append((statement.targets[0].attr, statement.value, statement.lineno))
            return found
    return []


def _follow(index: ModuleIndex, module: str, class_name: str, bare: str | None, path: str,
            depth: int) -> LanguageModel | None:
    if depth > 3:
        return None
    file = index.module_file(module)
    for attr, call, line in _init_assignments(index, module, class_name):
        spelled = ast.unparse(call.func)
        here = f"{path}.{attr}" if path else attr
        arguments = " ".join(ast.unparse(a) for a in call.args)
        if spelled.startswith("Auto") and spelled.endswith("from_config") and "text_config" in arguments:
            return LanguageModel(here, bare or f"{spelled.split('.')[0]}({arguments})", f"{file}:{line}")
        name = spelled.split(".")[0]  # Cls(config) or Cls._from_config(config.text_config)
        if bare is not None and name == bare:
            return LanguageModel(here, name, f"{file}:{line}")
        if not name[:1].isupper() or name.startswith(("nn", "Auto")):
            continue
        target = index.name_in_module(module, name)
        node = getattr(target, "node", None)
        if isinstance(node, ast.ClassDef):
            inner = _follow(index, target.module, name, bare, here, depth + 1)
            if inner is not None:
                return inner
    return None


def checkpoint_renames(model_type: str, index: ModuleIndex | None = None) -> list[tuple[str, str, str]]:
    """(checkpoint prefix, loaded prefix, file:line) of the plain renames transformers applies to a
    model_type's weights at load (`WeightRenaming(source_patterns=r"language_model.model", target_patterns=
    "model.language_model")` in conversion_mapping.py); patterns with groups are left out."""
    index = index or ModuleIndex()
    file = index.module_file("transformers.conversion_mapping")
    tree = index.tree(file) if file is not None else None
    found = []
    for node in ast.walk(tree) if tree is not None else ():
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if not (isinstance(key, ast.Constant) and key.value == model_type and isinstance(value, ast.List)):
                continue
            for call in value.elts:
                if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "WeightRenaming"):
                    continue
                words = {k.arg: k.value for k in call.keywords}
                source = words.get("source_patterns", call.args[0] if call.args else None)
                target = words.get("target_patterns", call.args[1] if len(call.args) > 1 else None)
                if (isinstance(source, ast.Constant) and isinstance(target, ast.Constant)
                        and isinstance(source.value, str) and isinstance(target.value, str)
                        and not any(c in source.value for c in "()[]*+?^$\\")):
                    found.append((source.value, target.value, f"{file}:{call.lineno}"))
    return found
