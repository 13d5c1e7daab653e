"""Where a missing name went: "moved to X (line N)", or a rename with the same signature.

Only asked when an import or a call's callee is certainly missing, so reading every file of the
installed package (a cheap text search first, `ast` only for the files that match) is affordable.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from specops.analysis._index import DefTarget, ModuleIndex, package_files, top_level

_WORD = re.compile(r"[a-z0-9]+")
_COMMON = frozenset({"get", "set", "is", "has", "to", "from", "of", "the", "and"})


@dataclass(frozen=True)
class Moved:
    module: str
    line: int
    target: DefTarget

    def describe(self, index: ModuleIndex) -> str:
        return f"moved to {self.module} ({index.relative_path(self.module)}:{self.line})"


def _files(index: ModuleIndex, package: str) -> list:

    cache = index.__dict__.setdefault("_package_files", {})
    if package not in cache:
        cache[package] = package_files(package, index)
    return cache[package]


def moved_definitions(index: ModuleIndex, qualname: str) -> list[Moved]:
    """Top-level definitions of `qualname`'s last name elsewhere in the same installed package."""
    module, _, name = qualname.rpartition(".")
    if not module or not name.isidentifier():
        return []
    pattern = re.compile(rf"(?m)^(?:async\s+def|def|class)\s+{re.escape(name)}\b")
    found = []
    for file in _files(index, top_level(qualname)):
        text = index.text(file) or ""
        if name not in text or not pattern.search(text):
            continue
        dotted = index.module_name_of(file)
        if dotted is None or dotted == module:
            continue
        tree = index.tree(file)
        for node in tree.body if tree is not None else ():
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
                found.append(Moved(dotted, node.lineno, DefTarget(dotted, node)))
    # the shortest module path first: the public home rather than a private helper module
    return sorted(found, key=lambda m: (m.module.count("."), m.module))


def renamed_in_module(index: ModuleIndex, module: str, name: str, accepts) -> list[tuple[str, int]]:
    """(name, line) of functions in `module` that share a word with `name` and for which
    `accepts(target)` holds (the call binds): a rename with the same signature."""
    scope = index.scope(module)
    if scope is None:
        return []
    words = set(_WORD.findall(name.lower())) - _COMMON
    found = []
    for other, binding in scope.names.items():
        node = getattr(binding, "node", None)
        if node is None or other == name or other.startswith("__"):
            continue
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        shared = (set(_WORD.findall(other.lower())) - _COMMON) & words
        if len(shared) >= max(1, len(words) // 2) and accepts(DefTarget(module, node)):
            found.append((len(shared), other, node.lineno))
    found.sort(key=lambda item: -item[0])
    return [(other, line) for _, other, line in found[:2]]


def where_it_went(index: ModuleIndex, qualname: str, accepts=lambda target: True) -> str:
    """A clause to append to a "no such name" detail, or ""."""
    moved = moved_definitions(index, qualname)
    if moved:
        first = moved[0]
        binds = accepts(first.target)
        clause = first.describe(index) + ("" if binds else "; the call does not bind there as written")
        if len(moved) > 1:
            clause += f" (also defined in {', '.join(m.module for m in moved[1:3])})"
        return clause
    module, _, name = qualname.rpartition(".")
    renamed = renamed_in_module(index, module, name, accepts) if index.module_file(module) else []
    if renamed:
        return "renamed with the same signature? " + ", ".join(
            f"{other} ({index.relative_path(module)}:{line})" for other, line in renamed)
    return ""


__all__ = ["Moved", "moved_definitions", "renamed_in_module", "where_it_went"]
