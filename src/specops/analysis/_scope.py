"""What a module's top-level names are bound to, read from its syntax tree without running it.

Bindings are descriptions, not values: `from x import y` is remembered as "name y of module x" and
resolved later, lazily, by the index. Later statements win, as at run time, with two exceptions that
keep imports resolvable: a `try` body wins over its `except` fallback, and an `else` branch of
`if TYPE_CHECKING:` never replaces what the typing branch imported.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DefBinding:  # a `def` or `class` statement in this module
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


@dataclass(frozen=True)
class ModuleBinding:  # `import a.b` binds a -> "a"; `import a.b as c` binds c -> "a.b"
    module: str


@dataclass(frozen=True)
class ImportBinding:  # `from module import name`
    module: str
    name: str


@dataclass(frozen=True)
class ExprBinding:  # `x = y.z`: an alias whose value is a plain dotted expression
    expr: ast.expr


@dataclass(frozen=True)
class OpaqueBinding:  # anything computed at run time
    line: int


@dataclass(frozen=True)
class LocalBinding:  # a function's own variable or parameter: not something from another module
    pass


Binding = DefBinding | ModuleBinding | ImportBinding | ExprBinding | OpaqueBinding | LocalBinding


def absolute_module(module: str | None, is_package: bool, level: int, target: str | None) -> str | None:
    """The absolute dotted name of `from <level dots><target> import ...` written in `module`."""
    if level == 0:
        return target
    if module is None:
        return None
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    if level - 1 > len(parts) or (level - 1 == len(parts) and not target):
        return None
    base = parts[: len(parts) - (level - 1)]
    if target:
        base.append(target)
    return ".".join(base) if base else None


def is_type_checking_test(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_dotted(expr: ast.expr) -> bool:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return isinstance(expr, ast.Name)


def import_bindings(node: ast.Import | ast.ImportFrom, module: str | None, is_package: bool
                    ) -> list[tuple[str, Binding]]:
    """Names an import statement binds (star imports bind nothing here)."""
    bound: list[tuple[str, Binding]] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname:
                bound.append((alias.asname, ModuleBinding(alias.name)))
            else:
                top = alias.name.split(".")[0]
                bound.append((top, ModuleBinding(top)))
        return bound
    source = absolute_module(module, is_package, node.level, node.module)
    for alias in node.names:
        if alias.name == "*":
            continue
        name = alias.asname or alias.name
        bound.append((name, ImportBinding(source, alias.name) if source else OpaqueBinding(node.lineno)))
    return bound


@dataclass
class ModuleScope:
    module: str | None
    is_package: bool
    names: dict[str, Binding] = field(default_factory=dict)
    star_imports: list[str] = field(default_factory=list)  # absolute module names, in order
    all_names: list[str] | None = None  # `__all__` when it is a literal list/tuple
    has_getattr: bool = False  # module-level __getattr__ (PEP 562) can answer any name

    @classmethod
    def build(cls, tree: ast.Module, module: str | None, is_package: bool) -> ModuleScope:
        scope = cls(module, is_package)
        scope._statements(tree.body, weak=False, fallback=False)
        scope.has_getattr = isinstance(scope.names.get("__getattr__"), DefBinding)
        return scope

    def _bind(self, name: str, binding: Binding, *, weak: bool, fallback: bool) -> None:
        # weak: an `except` fallback or the run-time `else` of TYPE_CHECKING; keeps what is there
        if (weak or fallback) and name in self.names:
            return
        self.names[name] = binding

    def _statements(self, body: list[ast.stmt], *, weak: bool, fallback: bool) -> None:
        for stmt in body:
            self._statement(stmt, weak=weak, fallback=fallback)

    def _statement(self, stmt: ast.stmt, *, weak: bool, fallback: bool) -> None:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            self._bind(stmt.name, DefBinding(stmt), weak=weak, fallback=fallback)
        elif isinstance(stmt, ast.Import | ast.ImportFrom):
            if isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names):
                source = absolute_module(self.module, self.is_package, stmt.level, stmt.module)
                if source:
                    self.star_imports.append(source)
            for name, binding in import_bindings(stmt, self.module, self.is_package):
                self._bind(name, binding, weak=weak, fallback=fallback)
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            value = stmt.value
            for target in targets:
                if isinstance(target, ast.Name):
                    if target.id == "__all__":
                        self.all_names = _literal_names(value)
                    elif value is not None and _is_dotted(value):
                        self._bind(target.id, ExprBinding(value), weak=weak, fallback=fallback)
                    elif value is not None:
                        self._bind(target.id, OpaqueBinding(stmt.lineno), weak=weak, fallback=fallback)
                elif isinstance(target, ast.Tuple | ast.List | ast.Starred):  # `a.b = ...` binds nothing
                    for node in ast.walk(target):
                        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                            self._bind(node.id, OpaqueBinding(stmt.lineno), weak=weak, fallback=fallback)
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            if stmt.target.id == "__all__":
                extra = _literal_names(stmt.value)
                if self.all_names is not None and extra is not None:
                    self.all_names = self.all_names + extra
                else:
                    self.all_names = None
        elif isinstance(stmt, ast.If):
            if is_type_checking_test(stmt.test):
                self._statements(stmt.body, weak=weak, fallback=fallback)
                self._statements(stmt.orelse, weak=weak, fallback=True)
            else:
                self._statements(stmt.body, weak=weak, fallback=fallback)
                self._statements(stmt.orelse, weak=weak, fallback=fallback)
        elif isinstance(stmt, ast.Try | ast.TryStar):
            self._statements(stmt.body, weak=weak, fallback=fallback)
            for handler in stmt.handlers:
                self._statements(handler.body, weak=True, fallback=fallback)
            self._statements(stmt.orelse, weak=weak, fallback=fallback)
            self._statements(stmt.finalbody, weak=weak, fallback=fallback)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            self._statements(stmt.body, weak=weak, fallback=fallback)


def _literal_names(value: ast.expr | None) -> list[str] | None:
    if isinstance(value, ast.List | ast.Tuple):
        names = [elt.value for elt in value.elts if isinstance(elt, ast.Constant) and isinstance(elt.value, str)]
        return names if len(names) == len(value.elts) else None
    return None


def function_locals(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, module: str | None,
                    is_package: bool) -> dict[str, Binding]:
    """Names a function binds itself: its imports (resolvable) and everything else (local)."""
    bound: dict[str, Binding] = {}
    args = node.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None:
            bound[arg.arg] = LocalBinding()
    body = node.body if isinstance(node.body, list) else [node.body]
    declared_global: set[str] = set()
    stack: list[ast.AST] = list(body)
    while stack:
        child = stack.pop()
        if isinstance(child, ast.Global | ast.Nonlocal):
            declared_global.update(child.names)
        elif isinstance(child, ast.Import | ast.ImportFrom):
            for name, binding in import_bindings(child, module, is_package):
                bound.setdefault(name, binding)
            continue
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound[child.name] = LocalBinding()
            stack.extend(child.decorator_list)
            continue
        elif isinstance(child, ast.Lambda):
            continue
        elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store | ast.Del):
            bound[child.id] = LocalBinding()
        elif isinstance(child, ast.ExceptHandler) and child.name:
            bound[child.name] = LocalBinding()
        elif isinstance(child, ast.MatchAs | ast.MatchStar) and child.name:
            bound[child.name] = LocalBinding()
        stack.extend(ast.iter_child_nodes(child))
    for name in declared_global:
        bound.pop(name, None)
    return bound
