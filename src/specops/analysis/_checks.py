"""Do the calls and imports in a file bind to the installed callees? Static, from source."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specops.analysis._index import DefTarget, ModuleIndex, Target, Unresolved, package_files, top_level
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
    function_locals,
    is_type_checking_test,
)
from specops.analysis._signatures import KEYWORD_ONLY, POSITIONAL_ONLY, Signature, SignatureReader, Unknown

CODE_WIDTH = 120
_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


@dataclass(frozen=True)
class CallShape:
    """How a call passes its arguments, as written: enough to bind placeholders to a live signature."""

    positional: int
    keywords: tuple[str, ...]
    star_args: bool
    star_kwargs: bool

    @classmethod
    def of(cls, call: ast.Call) -> CallShape:
        positional = [a for a in call.args if not isinstance(a, ast.Starred)]
        keywords = tuple(k.arg for k in call.keywords if k.arg is not None)
        return cls(len(positional), keywords, len(positional) < len(call.args), len(keywords) < len(call.keywords))

    def to_dict(self) -> dict:
        return {**asdict(self), "keywords": list(self.keywords)}


@dataclass(frozen=True)
class Finding:
    kind: str  # "call" | "import"
    status: str  # "ok" | "error" | "unknown"
    file: str  # absolute path of the calling / importing file
    line: int
    code: str  # the source text, one line, shortened
    callee: str  # dotted name of what is called or imported, "" if unresolved
    detail: str  # why, for a human
    shape: CallShape | None = field(default=None, compare=False, repr=False)  # calls only

    def to_dict(self) -> dict:
        return {key: value for key, value in asdict(self).items() if key != "shape"}


@dataclass(frozen=True)
class _Site:
    """Where a node sits: the function scopes around it and what guards it."""

    scopes: tuple[dict[str, Binding], ...]
    import_guarded: bool  # inside `try:` whose handler catches ImportError
    type_checking: bool  # inside `if TYPE_CHECKING:`


class _File:
    """One file being checked, with what is needed to resolve names written in it."""

    def __init__(self, path: Path, index: ModuleIndex):
        self.path = Path(path).resolve()
        self.index = index
        tree = index.tree(self.path)
        if tree is None:
            raise ValueError(f"{self.path}: not parseable Python source")
        self.tree = tree
        self.module = index.module_name_of(self.path)
        self.is_package = self.path.name == "__init__.py"
        if self.module is None:  # not importable from the search path: resolve through its own names only
            self.scope = ModuleScope.build(tree, None, self.is_package)
        else:
            self.scope = index.scope(self.module) or ModuleScope.build(tree, self.module, self.is_package)
        self.lines = (index.text(self.path) or "").splitlines()

    def code(self, node: ast.AST) -> str:
        first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1  # type: ignore[attr-defined]
        if first == last:
            segment = self.lines[first][node.col_offset: node.end_col_offset]  # type: ignore[attr-defined]
        else:
            segment = "\n".join([self.lines[first][node.col_offset:], *self.lines[first + 1: last],  # type: ignore[attr-defined]
                                  self.lines[last][: node.end_col_offset]])  # type: ignore[attr-defined]
        text = " ".join(segment.split())
        return text if len(text) <= CODE_WIDTH else text[: CODE_WIDTH - 1] + "…"

    def walk(self) -> Iterator[tuple[ast.AST, _Site]]:
        # check_calls and check_imports walk the same files: the walk (and its function_locals) once
        walks = self.index.__dict__.setdefault("_walks", {})
        key = (self.path, id(self.tree))
        if key not in walks:
            walks[key] = list(self._visit(self.tree, _Site((), False, False)))
        yield from walks[key]

    def _visit(self, node: ast.AST, site: _Site) -> Iterator[tuple[ast.AST, _Site]]:
        yield node, site
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            outer: list[ast.AST] = list(node.args.defaults) + [d for d in node.args.kw_defaults if d]
            if not isinstance(node, ast.Lambda):
                outer += node.decorator_list
            for child in outer:
                yield from self._visit(child, site)
            inner = _Site((*site.scopes, function_locals(node, self.module, self.is_package)),
                          site.import_guarded, site.type_checking)
            for child in node.body if isinstance(node.body, list) else [node.body]:
                yield from self._visit(child, inner)
            return
        if isinstance(node, ast.If) and is_type_checking_test(node.test):
            typing_site = _Site(site.scopes, site.import_guarded, True)
            for child in node.body:
                yield from self._visit(child, typing_site)
            for child in node.orelse:
                yield from self._visit(child, site)
            return
        if isinstance(node, ast.Try | ast.TryStar) and any(_catches_import_error(h) for h in node.handlers):
            guarded = _Site(site.scopes, True, site.type_checking)
            for child in node.body:
                yield from self._visit(child, guarded)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                yield from self._visit(child, site)
            return
        for child in ast.iter_child_nodes(node):
            yield from self._visit(child, site)

    def binding(self, name: str, site: _Site) -> Binding | None:
        for scope in reversed(site.scopes):
            if name in scope:
                return scope[name]
        return self.scope.names.get(name)

    def callee(self, func: ast.expr, site: _Site) -> tuple[str, Callable[[], Target]] | None:
        """(dotted name as written, how to resolve it) for `a.b.c(...)`; None for local values.
        Resolving is left to the caller: it parses modules, and most calls are not of interest."""
        attrs: list[str] = []
        while isinstance(func, ast.Attribute):
            attrs.insert(0, func.attr)
            func = func.value
        if not isinstance(func, ast.Name):
            return None
        binding = self.binding(func.id, site)
        own = self.module or "__main__"
        if binding is None or isinstance(binding, LocalBinding | OpaqueBinding):
            # builtins, locals, parameters, and this module's own run-time values (`log = getLogger()`):
            # nothing in them is a name of another package's API
            return None
        if isinstance(binding, ImportBinding):
            spelled = f"{binding.module}.{binding.name}"
        elif isinstance(binding, ModuleBinding):
            spelled = binding.module
        elif isinstance(binding, ExprBinding) and self.module:
            spelled = self.index.spelled(self.module, binding.expr) or f"{own}.{func.id}"
        else:
            spelled = f"{own}.{func.id}"
        spelled = ".".join([spelled, *attrs])

        def resolve() -> Target:
            if isinstance(binding, DefBinding) and self.module is None:
                return Unresolved(spelled, "defined in a file outside the search path")
            target = self.index.follow(own, binding, func.id)
            for attr in attrs:
                target = self.index.attribute(target, attr)
            return target

        return spelled, resolve


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in _IMPORT_ERRORS for n in names)


def _in_lines(node: ast.AST, only_lines: set[int] | None) -> bool:
    if only_lines is None:
        return True
    first = node.lineno  # type: ignore[attr-defined]
    last = getattr(node, "end_lineno", None) or first
    return any(line in only_lines for line in range(first, last + 1))


def _mentions(text: str, packages: set[str]) -> bool:
    return any(re.search(rf"\b{re.escape(name)}\b", text) for name in packages)


def _is_foreign(top: str, own_top: str | None, index: ModuleIndex, packages: set[str] | None) -> bool:
    if packages is not None:
        return top in packages
    if top == own_top or top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return False
    return index.module_file(top) is not None


def bind(signature: Signature, call: ast.Call) -> tuple[str, list[str]]:
    """('ok'|'error'|'unknown', reasons) for calling `signature` with `call`'s arguments."""
    positional = [a for a in call.args if not isinstance(a, ast.Starred)]
    star_args = len(positional) < len(call.args)
    keywords = [k.arg for k in call.keywords if k.arg is not None]
    star_kwargs = len(keywords) < len(call.keywords)
    by_name = {p.name: p for p in signature.params}
    positional_params = [p for p in signature.params if p.kind != KEYWORD_ONLY]
    problems: list[str] = []
    doubts: list[str] = []
    if len(positional) > len(positional_params) and not signature.var_positional:
        problems.append(f"too many positional arguments: {len(positional)} given, "
                        f"at most {len(positional_params)} accepted")
    bound = {p.name for p in positional_params[: len(positional)]}
    for keyword in keywords:
        param = by_name.get(keyword)
        if param is None or param.kind == POSITIONAL_ONLY:
            if signature.var_keyword:
                continue
            message = f"unexpected keyword '{keyword}'"
            (problems if signature.extra_keywords == "error" else doubts).append(
                message if signature.extra_keywords == "error" else f"{message} (may be ignored)")
        elif keyword in bound and not star_args:
            problems.append(f"multiple values for '{keyword}'")
        else:
            bound.add(keyword)
    for param in signature.params:
        if not param.required or param.name in bound:
            continue
        if (star_args and param.kind != KEYWORD_ONLY) or (star_kwargs and param.kind != POSITIONAL_ONLY):
            doubts.append(f"'{param.name}' may come from *args/**kwargs")
        else:
            problems.append(f"missing required parameter '{param.name}'")
    if problems:
        return "error", problems
    return ("unknown", doubts) if doubts else ("ok", [])


def check_calls(path: Path, index: ModuleIndex, *, packages: set[str] | None = None,
                only_lines: set[int] | None = None, any_package_lines: set[int] | None = None) -> list[Finding]:
    """Every call in `path` into another installed package (or into `packages`), bound statically to
    the installed callee's signature. On `any_package_lines` a call into any other installed package
    is checked too, whatever `packages` says (a patch's own lines)."""
    checked = _File(path, index)
    reader = _reader(index)
    own_top = top_level(checked.module) if checked.module else None
    findings: list[Finding] = []
    if packages is not None and any_package_lines is None and own_top not in packages and not _mentions(
            index.text(checked.path) or "", packages):
        return findings  # a call can only reach a package through an import that names it
    for node, site in checked.walk():
        if not isinstance(node, ast.Call) or site.type_checking or not _in_lines(node, only_lines):
            continue
        found = checked.callee(node.func, site)
        if found is None:
            continue
        spelled, resolve = found
        top = top_level(spelled)
        if not _is_foreign(top, own_top, index, packages) and not (
                any_package_lines is not None and _in_lines(node, any_package_lines)
                and _is_foreign(top, own_top, index, None)):
            continue
        findings.append(_call_finding(checked, node, spelled, resolve(), reader))
    return findings


def _call_finding(checked: _File, node: ast.Call, spelled: str, target: Target, reader: SignatureReader
                  ) -> Finding:
    def finding(status: str, callee: str, detail: str) -> Finding:
        return Finding("call", status, str(checked.path), node.lineno, checked.code(node), callee, detail,
                       CallShape.of(node))

    if isinstance(target, Unresolved):
        if target.missing:
            went = _where_it_went(reader, target.qualname, node)
            return finding("error", target.qualname, f"no such callee: {target.reason}{went}")
        return finding("unknown", target.qualname, f"could not resolve {spelled}: {target.reason}")
    signature = reader.of(target)
    if isinstance(signature, Unknown):
        return finding("unknown", target.qualname, signature.reason)
    status, reasons = bind(signature, node)
    detail = "; ".join([*reasons, signature.describe()])
    return finding(status, signature.qualname, detail)


def _where_it_went(reader: SignatureReader, qualname: str, call: ast.Call | None) -> str:
    """"; moved to X (line N)" when the missing name is defined elsewhere in its package."""
    from specops.analysis._moved import where_it_went

    def accepts(target: DefTarget) -> bool:
        if call is None:
            return True
        signature = reader.of(target)
        return not isinstance(signature, Signature) or bind(signature, call)[0] != "error"

    if reader.index.module_file(top_level(qualname)) is None:
        return ""
    clause = where_it_went(reader.index, qualname, accepts)
    return f"; {clause}" if clause else ""


def _reader(index: ModuleIndex) -> SignatureReader:
    reader = getattr(index, "_signature_reader", None)
    if reader is None:
        reader = SignatureReader(index)
        index._signature_reader = reader  # type: ignore[attr-defined]  # one cache per index
    return reader


def check_imports(path: Path, index: ModuleIndex, *, only_lines: set[int] | None = None) -> list[Finding]:
    """Every import in `path` resolves in the installed packages: module file exists, name bound there."""
    checked = _File(path, index)
    findings: list[Finding] = []
    for node, site in checked.walk():
        if not isinstance(node, ast.Import | ast.ImportFrom) or site.type_checking:
            continue
        if not _in_lines(node, only_lines):
            continue
        for callee, status, detail in _import_results(checked, node):
            if status == "error" and site.import_guarded:
                status, detail = "ok", f"{detail} (guarded by except ImportError)"
            findings.append(Finding("import", status, str(checked.path), node.lineno, checked.code(node),
                                    callee, detail))
    return findings


def _module_result(index: ModuleIndex, module: str) -> tuple[str, str]:
    if index.module_file(module) is not None:
        return "ok", f"{index.relative_path(module)}"
    top = top_level(module)
    if top in sys.builtin_module_names or (top in sys.stdlib_module_names and index.module_file(top) is None):
        return "ok", "standard library"
    if index.module_file(top) is None:
        return "error", f"package {top} is not installed"
    return "error", f"no module {module} in the installed {top}"


def _import_results(checked: _File, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str, str]]:
    index = checked.index
    if isinstance(node, ast.Import):
        return [(alias.name, *_module_result(index, alias.name)) for alias in node.names]
    source = absolute_module(checked.module, checked.is_package, node.level, node.module)
    if source is None:
        return [("", "unknown", "relative import in a file outside any package on the search path")]
    status, detail = _module_result(index, source)
    if status != "ok" or detail == "standard library":
        return [(source, status, detail)]
    results = []
    for alias in node.names:
        if alias.name == "*":
            results.append((source, "ok", detail))
            continue
        qualname = f"{source}.{alias.name}"
        scope = index.scope(source)
        if scope is not None and alias.name in scope.names:
            results.append((qualname, "ok", f"bound in {index.relative_path(source)}"))
            continue
        target = index.name_in_module(source, alias.name)
        if isinstance(target, Unresolved):
            status = "error" if target.missing else "unknown"
            went = _where_it_went(_reader(index), qualname, None) if target.missing else ""
            results.append((qualname, status, f"{target.reason}{went}"))
        else:
            where = target.qualname if isinstance(target, DefTarget) else f"module {target.qualname}"
            results.append((qualname, "ok", where))
    return results


def check_package(package: str, index: ModuleIndex, *, into: set[str]) -> list[Finding]:
    """check_calls and check_imports over every module of an installed package, for what goes into `into`."""
    findings: list[Finding] = []
    for file in package_files(package, index):
        if index.tree(file) is None:
            findings.append(Finding("import", "unknown", str(file), 1, "", "", "file does not parse"))
            continue
        findings.extend(check_calls(file, index, packages=into))
        findings.extend(f for f in check_imports(file, index) if top_level(f.callee) in into)
    return findings
