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
"""

from specops.analysis._bound import check_assigned_functions, check_bound_functions
from specops.analysis._checks import CallShape, Finding, bind, check_calls, check_imports, check_package, package_files
from specops.analysis._engine_loop import check_engine_loop
from specops.analysis._index import DefTarget, ModuleIndex, ModuleTarget, Unresolved
from specops.analysis._instances import check_instance_calls
from specops.analysis._live import bind_live
from specops.analysis._moved import where_it_went
from specops.analysis._signatures import Signature, SignatureReader, Unknown

__all__ = [
    "CallShape",
    "DefTarget",
    "Finding",
    "ModuleIndex",
    "ModuleTarget",
    "Signature",
    "SignatureReader",
    "Unknown",
    "Unresolved",
    "bind",
    "bind_live",
    "check_assigned_functions",
    "check_bound_functions",
    "check_calls",
    "check_engine_loop",
    "check_imports",
    "check_instance_calls",
    "check_package",
    "package_files",
    "where_it_went",
]
