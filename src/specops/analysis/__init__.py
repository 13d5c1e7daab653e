"""Static analysis of installed Python packages: resolve modules and names, bind calls and imports.

Standard library only, and nothing it inspects is ever imported: modules are found by walking the
search path and read with `ast`, lazily, so a check touches only the modules it needs.

    index = ModuleIndex([site_dir])        # default: this interpreter's sys.path
    check_calls(file, index, packages={"vllm"})   # -> [Finding(kind="call", status="error", ...)]
    check_imports(file, index)
    check_package("speculators", index, into={"vllm", "transformers"})
    bind_live("pkg.module", findings)   # --deep: the same calls bound in a child interpreter
    check_instance_calls(file, index, packages={"vllm"})   # self.scheduler.schedule(...) and friends
    check_bound_functions(file, index, ["LlamaForCausalLM"])  # types.MethodType(fn, model.model)
    check_engine_loop(file, index)      # steps of vLLM's EngineCore.step a hand-driven loop skips
    where_it_went(index, "vllm.v1.core.kv_cache_utils.get_kv_cache_config_from_groups")  # moved to ...
    resolve_auto_class("kimi_k25")      # transformers' class for a model_type, from its auto mappings
    target_load(config, trust)          # the class the pipeline loads a target folder with (and the doctor judges)
    language_model("Kimi_K25ForConditionalGeneration", "kimi_k25", "deepseek_v3")  # -> model.language_model
"""

from specops.analysis import _cache as cache
from specops.analysis._auto_models import (
    AutoClass,
    LanguageModel,
    TargetLoad,
    base_model_class,
    checkpoint_renames,
    language_model,
    read_mappings,
    resolve_auto_class,
    target_load,
    text_model_type,
)
from specops.analysis._bound import check_assigned_functions, check_bound_functions, files_binding_methods
from specops.analysis._checks import CallShape, Finding, bind, check_calls, check_imports, check_package
from specops.analysis._engine_loop import check_engine_loop
from specops.analysis._index import DefTarget, ModuleIndex, ModuleTarget, Unresolved, package_files
from specops.analysis._instances import check_instance_calls, types_of
from specops.analysis._live import bind_live
from specops.analysis._moved import moved_definitions, where_it_went
from specops.analysis._registry import common_architectures
from specops.analysis._scope import absolute_module
from specops.analysis._signatures import Signature, SignatureReader, Unknown
from specops.analysis._types import Instance, Scope

__all__ = [
    "AutoClass",
    "CallShape",
    "DefTarget",
    "Finding",
    "Instance",
    "LanguageModel",
    "ModuleIndex",
    "ModuleTarget",
    "Scope",
    "Signature",
    "SignatureReader",
    "TargetLoad",
    "Unknown",
    "Unresolved",
    "absolute_module",
    "base_model_class",
    "bind",
    "bind_live",
    "cache",
    "check_assigned_functions",
    "check_bound_functions",
    "check_calls",
    "check_engine_loop",
    "check_imports",
    "check_instance_calls",
    "check_package",
    "checkpoint_renames",
    "common_architectures",
    "files_binding_methods",
    "language_model",
    "moved_definitions",
    "package_files",
    "read_mappings",
    "resolve_auto_class",
    "target_load",
    "text_model_type",
    "types_of",
    "where_it_went",
]
