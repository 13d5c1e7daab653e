"""Find and read installed modules by walking a search path, never importing them.

`importlib.util.find_spec("a.b")` imports `a` to learn its `__path__`; this index walks the folders
itself (regular packages, namespace packages, plain modules, compiled extensions) and parses a file
only when a question needs it, once.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specops.analysis._scope import (
    Binding,
    DefBinding,
    ExprBinding,
    ImportBinding,
    LocalBinding,
    ModuleBinding,
    ModuleScope,
    OpaqueBinding,
    absolute_module,
)

EXTENSION_SUFFIXES = (".so", ".pyd")
MAX_DEPTH = 16  # re-export hops followed before giving up with "unknown"
BUILTIN_NAMES = frozenset(dir(builtins))
# Bases that add no constructor parameters: skipped when looking for __init__.
TRANSPARENT_BASES = frozenset({
    "builtins.object", "abc.ABC", "typing.Generic", "typing.Protocol", "typing_extensions.Protocol",
    "typing_extensions.Generic",
})
_STAR_IMPORT = re.compile(r"^\s*from\s+([.\w]+)\s+import\s+\*", re.MULTILINE)


@dataclass(frozen=True)
class ModuleTarget:
    module: str

    @property
    def qualname(self) -> str:
        return self.module


@dataclass(frozen=True)
class DefTarget:
    """A `def` or `class` in parsed source. `owner` is the class for methods and nested classes."""

    module: str
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    owner: DefTarget | None = None

    @property
    def qualname(self) -> str:
        prefix = self.owner.qualname if self.owner else self.module
        return f"{prefix}.{self.node.name}"

    @property
    def is_class(self) -> bool:
        return isinstance(self.node, ast.ClassDef)


@dataclass(frozen=True)
class Unresolved:
    """Could not be followed to source. `missing` means it certainly does not exist."""

    qualname: str
    reason: str
    missing: bool = False


Target = ModuleTarget | DefTarget | Unresolved


class ModuleIndex:
    def __init__(self, search_path: list[str] | None = None):
        entries = search_path if search_path is not None else sys.path
        self.search_path = [str(Path(entry or ".").resolve()) for entry in entries]
        self._files: dict[str, Path | None] = {}
        self._namespace_dirs: dict[str, list[Path]] = {}
        self._listings: dict[Path, frozenset[str]] = {}
        self._texts: dict[Path, str | None] = {}
        self._trees: dict[Path, ast.Module | None] = {}
        self._scopes: dict[str, ModuleScope | None] = {}
        self._names_of_file: dict[Path, str | None] = {}
        self._may_define_cache: dict[tuple[str, str], bool] = {}
        self.signatures: dict[int, object] = {}  # filled by the signatures module, keyed by id(node)
        self.overlays: dict[Path, str] = {}  # files read as given here, not as on disk (overlay())

    @property
    def files_parsed(self) -> int:
        """How many source files this index has parsed: the measure of how lazy a check was."""
        return sum(1 for tree in self._trees.values() if tree is not None)

    # ---- finding files -------------------------------------------------------------------------
    def _listing(self, folder: Path) -> frozenset[str]:
        if folder not in self._listings:
            try:
                self._listings[folder] = frozenset(os.listdir(folder))
            except OSError:
                self._listings[folder] = frozenset()
        return self._listings[folder]

    def module_file(self, dotted: str) -> Path | None:
        """The file of an installed module: `.py`, a package's `__init__.py`, a compiled extension, or
        for a namespace package its first folder. None when it is not on the search path."""
        if dotted in self._files:
            return self._files[dotted]
        parts = dotted.split(".")
        if len(parts) == 1:
            folders = [Path(entry) for entry in self.search_path]
        else:
            parent = ".".join(parts[:-1])
            folders = self.package_dirs(parent) if self.module_file(parent) is not None else []
        found = self._find_in(folders, parts[-1], dotted)
        self._files[dotted] = found
        return found

    def _find_in(self, folders: list[Path], name: str, dotted: str) -> Path | None:
        portions: list[Path] = []
        for folder in folders:
            listing = self._listing(folder)
            if name in listing and "__init__.py" in self._listing(folder / name):
                return folder / name / "__init__.py"
            if f"{name}.py" in listing:
                return folder / f"{name}.py"
            for entry in listing:
                if entry.startswith(f"{name}.") and entry.endswith(EXTENSION_SUFFIXES):
                    return folder / entry
            if name in listing and (folder / name).is_dir():
                portions.append(folder / name)
        if portions:
            self._namespace_dirs[dotted] = portions
            return portions[0]
        return None

    def package_dirs(self, dotted: str) -> list[Path]:
        """Folders a package's submodules live in (several for a namespace package)."""
        file = self.module_file(dotted)
        if file is None:
            return []
        if file.name == "__init__.py":
            return [file.parent]
        return self._namespace_dirs.get(dotted, [])

    def is_package(self, dotted: str) -> bool:
        return bool(self.package_dirs(dotted))

    def module_name_of(self, path: Path) -> str | None:
        """The dotted name under which `path` is importable from the search path, if it is."""
        path = Path(path).resolve()
        if path in self._names_of_file:
            return self._names_of_file[path]
        name = None
        for entry in self.search_path:
            try:
                relative = path.relative_to(entry)
            except ValueError:
                continue
            parts = list(relative.with_suffix("").parts)
            if parts and parts[-1] == "__init__":
                parts = parts[:-1]
            if parts and all(part.isidentifier() for part in parts):
                dotted = ".".join(parts)
                if self.module_file(dotted) == path:
                    name = dotted
                    break
        self._names_of_file[path] = name
        return name

    def relative_path(self, dotted: str) -> str:
        """`vllm/v1/core/kv_cache_utils.py` for `vllm.v1.core.kv_cache_utils`, as people cite it."""
        file = self.module_file(dotted)
        base = "/".join(dotted.split("."))
        if file is None:
            return base
        return f"{base}/__init__.py" if file.name == "__init__.py" else f"{base}{file.suffix}"

    # ---- reading -------------------------------------------------------------------------------
    def overlay(self, path: Path, text: str) -> None:
        """Read `path` as `text` from now on: the source as a patch set that has not run yet will leave
        it, so a check judges the code that will run (the doctor before the pipeline's patches step)."""
        self.overlays[path] = text
        self._texts[path] = text
        self._trees.pop(path, None)
        self._scopes.clear()

    def text(self, path: Path) -> str | None:
        if path not in self._texts:
            try:
                self._texts[path] = path.read_text(encoding="utf-8", errors="replace")
            except (OSError, UnicodeError):
                self._texts[path] = None
        return self._texts[path]

    def tree(self, path: Path) -> ast.Module | None:
        """The parsed file, once; None for what is not Python source or does not parse."""
        if path not in self._trees:
            source = self.text(path) if path.suffix == ".py" else None
            tree = None
            if source is not None:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # invalid escapes etc. in third-party code
                        tree = ast.parse(source, filename=str(path))
                except (SyntaxError, ValueError):
                    tree = None
            self._trees[path] = tree
        return self._trees[path]

    def scope(self, dotted: str) -> ModuleScope | None:
        if dotted not in self._scopes:
            file = self.module_file(dotted)
            tree = self.tree(file) if file is not None and file.is_file() else None
            is_namespace = file is not None and file.is_dir()
            if is_namespace:
                self._scopes[dotted] = ModuleScope(dotted, True)
            else:
                self._scopes[dotted] = ModuleScope.build(tree, dotted, self.is_package(dotted)) if tree else None
        return self._scopes[dotted]

    # ---- resolving names -----------------------------------------------------------------------
    def resolve(self, qualname: str) -> Target:
        """Follow a dotted name (`vllm.config.SchedulerConfig`) to its definition."""
        parts = qualname.split(".")
        for cut in range(len(parts), 0, -1):
            module = ".".join(parts[:cut])
            if self.module_file(module) is not None:
                target: Target = ModuleTarget(module)
                for attr in parts[cut:]:
                    target = self.attribute(target, attr)
                return target
        return Unresolved(qualname, f"module {parts[0]} is not installed", missing=True)

    def name_in_module(self, module: str, name: str, depth: int = 0, *, exported_only: bool = False
                       ) -> Target:
        qualname = f"{module}.{name}"
        if depth > MAX_DEPTH:
            return Unresolved(qualname, "too many re-export hops")
        file = self.module_file(module)
        if file is None:
            return Unresolved(qualname, f"module {module} is not installed", missing=True)
        scope = self.scope(module)
        if scope is None:
            return Unresolved(qualname, f"{file.name} is not Python source")
        if exported_only and (
            (scope.all_names is not None and name not in scope.all_names)
            or (scope.all_names is None and name.startswith("_"))
        ):
            return Unresolved(qualname, f"{module} does not export {name}", missing=True)
        binding = scope.names.get(name)
        if binding == ImportBinding(module, name):
            # `from torch import cuda` inside torch/__init__.py: the import system loads the submodule
            binding = None
        if binding is not None:
            found = self.follow(module, binding, name, depth + 1)
            if isinstance(found, Unresolved) and found.missing:
                # the name is bound here; that its origin is absent is not the importer's problem
                return Unresolved(qualname, f"bound in {module} from {found.qualname}: {found.reason}")
            return found
        # First match wins (at run time the last would): names rarely repeat across star imports, and
        # transformers' 500-model star list is far cheaper to search from the front.
        for star in scope.star_imports:
            if self._may_define(star, name):
                found = self.name_in_module(star, name, depth + 1, exported_only=True)
                if not (isinstance(found, Unresolved) and found.missing):
                    return found
        if scope.is_package and self.module_file(qualname) is not None:
            return ModuleTarget(qualname)
        if scope.has_getattr:
            return Unresolved(qualname, f"{module} answers names through a module __getattr__")
        return Unresolved(qualname, f"{module} ({self.relative_path(module)}) has no name '{name}'",
                          missing=True)

    def _may_define(self, module: str, name: str, seen: frozenset[str] = frozenset()) -> bool:
        """Cheap text test before parsing: can `name` come out of `module`, directly or by star imports?"""
        key = (module, name)
        if key in self._may_define_cache:
            return self._may_define_cache[key]
        file = self.module_file(module)
        text = self.text(file) if file is not None and file.is_file() else None
        if text is None:
            result = file is not None and file.is_dir()  # a namespace package may have the submodule
            result = result or (file is not None and file.suffix in EXTENSION_SUFFIXES)
        elif name in text:
            result = _exports_textually(text, name)
        else:
            result = False
            for match in _STAR_IMPORT.finditer(text) if "import *" in text else ():
                target = match.group(1)
                level = len(target) - len(target.lstrip("."))
                star = absolute_module(module, file.name == "__init__.py", level, target.lstrip(".") or None)
                if star and star not in seen and self._may_define(star, name, seen | {module}):
                    result = True
                    break
        self._may_define_cache[key] = result
        return result

    def follow(self, module: str, binding: Binding, name: str, depth: int = 0) -> Target:
        qualname = f"{module}.{name}"
        if isinstance(binding, DefBinding):
            return DefTarget(module, binding.node)
        if isinstance(binding, ModuleBinding):
            if self.module_file(binding.module) is None:
                return Unresolved(binding.module, f"module {binding.module} is not installed", missing=True)
            return ModuleTarget(binding.module)
        if isinstance(binding, ImportBinding):
            return self.name_in_module(binding.module, binding.name, depth + 1)
        if isinstance(binding, ExprBinding):
            return self.expression(module, binding.expr, depth + 1)
        if isinstance(binding, OpaqueBinding):
            return Unresolved(qualname, f"assigned at run time ({self.relative_path(module)}:{binding.line})")
        if isinstance(binding, LocalBinding):
            return Unresolved(qualname, "a local variable")
        return Unresolved(qualname, "unsupported binding")

    def expression(self, module: str, expr: ast.expr, depth: int = 0) -> Target:
        """Resolve a plain dotted expression (`a`, `a.b.c`) written at the top level of `module`."""
        if isinstance(expr, ast.Name):
            scope = self.scope(module)
            binding = scope.names.get(expr.id) if scope else None
            if binding is None and expr.id in BUILTIN_NAMES:
                return Unresolved(f"builtins.{expr.id}", "a builtin")
            if binding is None:
                return self.name_in_module(module, expr.id, depth)
            return self.follow(module, binding, expr.id, depth)
        if isinstance(expr, ast.Attribute):
            return self.attribute(self.expression(module, expr.value, depth + 1), expr.attr, depth + 1)
        return Unresolved(f"{module}.?", "not a plain name")

    def attribute(self, target: Target, attr: str, depth: int = 0) -> Target:
        if isinstance(target, Unresolved):
            return Unresolved(f"{target.qualname}.{attr}", target.reason, target.missing)
        if isinstance(target, ModuleTarget):
            return self.name_in_module(target.module, attr, depth)
        if target.is_class:
            return self.class_member(target, attr, depth)
        return Unresolved(f"{target.qualname}.{attr}", "attribute of a function")

    def class_member(self, cls: DefTarget, attr: str, depth: int = 0) -> Target:
        for klass in self.iter_mro(cls):
            if isinstance(klass, Unresolved):
                return Unresolved(f"{cls.qualname}.{attr}", f"base class {klass.qualname}: {klass.reason}")
            for stmt in klass.node.body:
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and stmt.name == attr:
                    return DefTarget(klass.module, stmt, klass)
                if isinstance(stmt, ast.Assign | ast.AnnAssign):
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                        return Unresolved(f"{klass.qualname}.{attr}", "a class attribute assigned a value")
        return Unresolved(f"{cls.qualname}.{attr}", "not defined in the class body or its bases")

    def bases(self, cls: DefTarget) -> list[Target]:
        """The class's bases as targets; subscripts (`Generic[T]`) are read as their origin."""
        found: list[Target] = []
        for base in cls.node.bases:  # type: ignore[union-attr]
            if isinstance(base, ast.Subscript):
                base = base.value
            spelled = self.spelled(cls.module, base)
            if spelled in TRANSPARENT_BASES:
                continue
            found.append(self.expression(cls.module, base))
        return found

    def spelled(self, module: str, expr: ast.expr, local: dict[str, Binding] | None = None) -> str | None:
        """The dotted name an expression is written as, after one import hop: `torch.no_grad` for
        `import torch; torch.no_grad`. No parsing of other modules."""
        if isinstance(expr, ast.Attribute):
            base = self.spelled(module, expr.value, local)
            return f"{base}.{expr.attr}" if base else None
        if not isinstance(expr, ast.Name):
            return None
        binding = (local or {}).get(expr.id)
        if binding is None:
            scope = self.scope(module)
            binding = scope.names.get(expr.id) if scope else None
        if binding is None:
            return f"builtins.{expr.id}" if expr.id in BUILTIN_NAMES else f"{module}.{expr.id}"
        if isinstance(binding, ImportBinding):
            return f"{binding.module}.{binding.name}"
        if isinstance(binding, ModuleBinding):
            return binding.module
        if isinstance(binding, DefBinding):
            return f"{module}.{expr.id}"
        if isinstance(binding, ExprBinding):
            return self.spelled(module, binding.expr)
        return None

    def mro(self, cls: DefTarget, depth: int = 0) -> list[DefTarget | Unresolved]:
        """Depth-first, left-to-right, de-duplicated: C3 in every case that matters for __init__."""
        return list(self.iter_mro(cls, depth))

    def iter_mro(self, cls: DefTarget, depth: int = 0) -> Iterator[DefTarget | Unresolved]:
        """`mro` one class at a time: a base is resolved (its module parsed) only when asked for, so a
        lookup that the class itself answers never reads transformers' PreTrainedModel and its mixins."""
        seen: list[DefTarget | Unresolved] = []
        for klass in self._walk_mro(cls, depth):
            if klass not in seen:
                seen.append(klass)
                yield klass

    def _walk_mro(self, cls: DefTarget, depth: int) -> Iterator[DefTarget | Unresolved]:
        yield cls
        if depth > MAX_DEPTH:
            yield Unresolved(cls.qualname, "class hierarchy too deep")
            return
        for base in self.bases(cls):
            if isinstance(base, ModuleTarget):
                yield Unresolved(base.qualname, "a module used as a base class")
            elif isinstance(base, Unresolved):
                yield base
            elif not base.is_class:
                yield Unresolved(base.qualname, "a function used as a base class")
            else:
                yield from self._walk_mro(base, depth + 1)


def _exports_textually(text: str, name: str) -> bool:
    """Could a star import of this text export `name`? Errs towards yes; only used to skip parsing."""
    if re.search(r"(?m)^__all__\s*=\s*[\[(]", text) and "__all__ +=" not in text and "__all__.extend" not in text:
        if f'"{name}"' not in text and f"'{name}'" not in text:
            return False  # a literal __all__ that does not list it
    word = re.escape(name)
    pattern = (rf"(?m)\b(?:def|class)\s+{word}\b|^[ \t]*{word}\s*(?:[:=,)]|$)|\bimport\b[^\n]*\b{word}\b"
               rf"|\bas\s+{word}\b|\b{word}\s*(?:,\s*[\w.]+\s*)*=")
    return re.search(pattern, text) is not None


def top_level(qualname: str) -> str:
    return qualname.split(".")[0]


__all__ = ["DefTarget", "ModuleIndex", "ModuleTarget", "Target", "Unresolved", "top_level"]


def package_files(package: str, index: ModuleIndex) -> list[Path]:
    files: list[Path] = []
    for folder in index.package_dirs(package):
        files.extend(sorted(p for p in folder.rglob("*.py") if all(part.isidentifier() for part in
                                                                    p.relative_to(folder).with_suffix("").parts)))
    if not files and (file := index.module_file(package)) is not None and file.suffix == ".py":
        files.append(file)
    return files
