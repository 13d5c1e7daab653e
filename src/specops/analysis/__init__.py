"""Static analysis of installed Python packages: resolve modules and names, bind calls and imports.

Standard library only, and nothing it inspects is ever imported: modules are found by walking the
search path and read with `ast`, lazily, so a check touches only the modules it needs.

    index = ModuleIndex([site_dir])        # default: this interpreter's sys.path
    check_calls(file, index, packages={"vllm"})   # -> [Finding(kind="call", status="error", ...)]
    check_imports(file, index)
    check_package("speculators", index, into={"vllm", "transformers"})
    bind_live("pkg.module", findings)   # --deep: the same calls bound in a child interpreter
"""

from specops.analysis._checks import CallShape, Finding, bind, check_calls, check_imports, check_package, package_files
from specops.analysis._index import DefTarget, ModuleIndex, ModuleTarget, Unresolved
from specops.analysis._live import bind_live
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
    "check_calls",
    "check_imports",
    "check_package",
    "package_files",
]
