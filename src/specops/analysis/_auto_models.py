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


def read_mappings(file: Path) -> dict[str, dict[str, tuple[str, int]]]:
    """Every `NAME = OrderedDict([("type", "Class"), ...])` of the file: {NAME: {type: (Class, line)}}."""
    tree = ast.parse(file.read_text(), str(file))
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
    file = (index or ModuleIndex()).module_file(AUTO_MODULE)
    if file is None:
        return None
    mappings = read_mappings(file)
    for name in GENERATING_MAPPINGS:
        found = mappings.get(name, {}).get(model_type)
        if found is not None:
            return AutoClass(model_type, found[0], name, f"{file}:{found[1]}")
    return AutoClass(model_type, None, None, str(file))


def base_model_class(model_type: str, index: ModuleIndex | None = None) -> str | None:
    """The bare model class (`MODEL_MAPPING_NAMES`) of model_type: what `AutoModel.from_config` builds
    for a wrapper's text_config."""
    file = (index or ModuleIndex()).module_file(AUTO_MODULE)
    if file is None:
        return None
    found = read_mappings(file).get("MODEL_MAPPING_NAMES", {}).get(model_type)
    return found[0] if found else None
