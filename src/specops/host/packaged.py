"""Files that ship inside installed Python packages, named `pkg:MODULE/PATH` in a run config.

A real model, data set or benchmark set can come as a wheel (SmolLM2's GGUF, ShareGPT, MT-Bench's
questions, HumanEval's prompts): the run names the file inside the installed package instead of a path
that differs on every host, and each host finds it in its own env. Nothing is imported to find it (a
package's `__init__` may be slow or pull in heavy dependencies): the module's folder is looked up on the
search path as the import system would, standard library only.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from specops.contract.errors import BadInput

PREFIX = "pkg:"
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_packaged(value: str) -> bool:
    return value.startswith(PREFIX)


def split_reference(value: str) -> tuple[str, str]:
    """(module, path inside it) of `pkg:MODULE/PATH`; BadInput (without a key: the caller names it)."""
    module, _, inner = value[len(PREFIX):].partition("/")
    if not _MODULE.match(module) or not inner:
        raise BadInput(f"{value!r}: expected pkg:MODULE/PATH (an installed top-level package, then a file in it)")
    parts = Path(inner).parts
    if Path(inner).is_absolute() or ".." in parts:
        raise BadInput(f"{value!r}: the path inside the package must stay inside it (no '..', not absolute)")
    return module, inner


def module_folder(module: str, search_path: list[str] | None = None) -> Path | None:
    """The folder of an installed top-level package, first on the search path; None when none has it."""
    for entry in search_path if search_path is not None else sys.path:
        folder = Path(entry or ".") / module
        if folder.is_dir():
            return folder
    return None


def resolve_packaged(value: str, search_path: list[str] | None = None) -> Path:
    """The file `pkg:MODULE/PATH` names in this env; BadInput when the package or the file is not there."""
    module, inner = split_reference(value)
    folder = module_folder(module, search_path)
    if folder is None:
        raise BadInput(f"{value!r}: no package {module!r} is installed in this env ({sys.executable}); the README's "
                       "'A real model' section says how to install the registry's packages")
    path = folder / inner
    if not path.is_file():
        raise BadInput(f"{value!r}: package {module!r} ({folder}) has no file {inner}")
    return path
