"""speculators train's processor against a multimodal wrapper, judged before any load.

`speculators train` reads its verifier's processor through `load_processor`
(speculators/data_generation/preprocessing.py), which asks transformers' AutoProcessor. For a wrapper's
model_type transformers has a native multimodal processor (Kimi-K2.5: `Kimi_K25Processor`, whose image
processor needs a preprocessor config and torchvision), so a checkpoint folder without a processor config
stops the training at its start: `OSError: Can't load image processor`. Read from the files: the
model_type's processor in transformers' auto mappings, the folder's processor configs, and whether
speculators' `load_processor` calls AutoProcessor itself (the patch set speculators-0.9.0-wrapper makes it
read a folder without one as text only, through its tokenizer).
"""

from __future__ import annotations

import ast
from pathlib import Path

from specops.analysis import ModuleIndex, read_mappings
from specops.doctor._report import Item

# where transformers keeps PROCESSOR_MAPPING_NAMES: 5.19 gathers the mappings in auto_mappings.py
MAPPING_MODULES = ("transformers.models.auto.auto_mappings", "transformers.models.auto.processing_auto")
PROCESSOR_CONFIGS = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json")
LOADER_MODULE = "speculators.data_generation.preprocessing"
LOADER = "load_processor"


def native_processor(index: ModuleIndex, model_type: str) -> tuple[str, str] | None:
    """(class, file:line) of transformers' own processor for model_type, None when it has none."""
    for module in MAPPING_MODULES:
        file = index.module_file(module)
        if file is None:
            continue
        found = read_mappings(file).get("PROCESSOR_MAPPING_NAMES", {}).get(model_type)
        if found is not None:
            return found[0], f"{file}:{found[1]}"
    return None


def calls_auto_processor(index: ModuleIndex) -> tuple[Path, int] | None:
    """(file, line) of an `AutoProcessor.from_pretrained(...)` made in speculators' load_processor itself
    (what it loads whatever the folder holds); None when it makes none or is not there."""
    file = index.module_file(LOADER_MODULE)
    tree = index.tree(file) if file is not None else None
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.FunctionDef) and node.name == LOADER:
            for call in ast.walk(node):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "from_pretrained" and isinstance(call.func.value, ast.Name)
                        and call.func.value.id == "AutoProcessor"):
                    return file, call.lineno
    return None


def processor_items(index: ModuleIndex, model_dir: str | None, model_type: str | None,
                    speculators: str | None) -> list[Item]:
    if not model_dir or not isinstance(model_type, str) or speculators is None:
        return []
    native = native_processor(index, model_type)
    folder = Path(model_dir)
    if native is None or any((folder / name).is_file() for name in PROCESSOR_CONFIGS):
        return []  # a text model's processor is its tokenizer; a folder with a config gets its own processor
    call = calls_auto_processor(index)
    if call is None:
        return [Item("model", "ok", f"{LOADER_MODULE}.{LOADER}",
                     f"speculators {speculators} reads a folder without a processor config as text only: "
                     f"{model_type}'s native {native[0]} ({Path(native[1]).name}) is not built")]
    file, line = call
    return [Item("model", "error", f"{file}:{line}",
                 f"speculators {speculators} train loads the verifier's processor with AutoProcessor "
                 f"({file.name}:{line}), which builds {model_type}'s native {native[0]} "
                 f"({Path(native[1]).name}:{native[1].rsplit(':', 1)[1]}), and {folder} ships no processor "
                 f"config ({', '.join(PROCESSOR_CONFIGS)}): the training stops at its start "
                 "(OSError: Can't load image processor)",
                 "apply patch set speculators-0.9.0-wrapper (the pipeline's patches step does; "
                 "`invoke patch apply --set speculators-0.9.0-wrapper`)")]


REGISTRY_MODULE = "vllm.model_executor.models.registry"


def multimodal_in_vllm(serving: ModuleIndex, architecture: str) -> tuple[str, str] | None:
    """(vLLM module, file:line) when vLLM's registry serves `architecture` as a multimodal model
    (`_MULTIMODAL_MODELS`): it builds the model's processor from the checkpoint at the server's start."""
    file = serving.module_file(REGISTRY_MODULE)
    tree = serving.tree(file) if file is not None else None
    for node in tree.body if tree is not None else ():
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if not (isinstance(target, ast.Name) and target.id == "_MULTIMODAL_MODELS"
                and isinstance(node.value, ast.Dict)):
            continue
        for key, value in zip(node.value.keys, node.value.values, strict=True):
            if (isinstance(key, ast.Constant) and key.value == architecture and isinstance(value, ast.Tuple)
                    and value.elts and isinstance(value.elts[0], ast.Constant)):
                return str(value.elts[0].value), f"{file}:{key.lineno}"
    return None


def served_processor_items(serving: ModuleIndex, model_dir: str | None, architecture: str | None,
                           backend: str | None) -> list[Item]:
    """On the vllm backend: a target vLLM serves as a multimodal model needs the checkpoint's own processor
    (Kimi-K2.5's `kimi_k25` reads its image processor's `media_tokens_calculator`); a folder without a
    processor config cannot start the server, after minutes of loading weights."""
    if backend != "vllm" or not model_dir or not isinstance(architecture, str):
        return []
    found = multimodal_in_vllm(serving, architecture)
    folder = Path(model_dir)
    if found is None or any((folder / name).is_file() for name in PROCESSOR_CONFIGS):
        return []
    module, where = found
    return [Item("model", "error", where,
                 f"vLLM serves {architecture} as a multimodal model ({module}.py) and builds its processor from the "
                 f"checkpoint at the server's start; {folder} ships no processor config "
                 f"({', '.join(PROCESSOR_CONFIGS)}): the server cannot start",
                 "ship the checkpoint's own processor (its preprocessor_config.json and remote code), or serve the "
                 "text model alone (its DeepseekV3ForCausalLM config, as runs/tiny-kimi-text.yaml), or backend: hf")]
