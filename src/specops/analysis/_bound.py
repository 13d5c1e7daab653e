"""Functions attached to a model at run time: `obj.forward = types.MethodType(fn, obj)`.

Inside `fn`, `self` is whatever `obj` is when the binding runs. A vLLM worker extension reaches the
model as `self.model_runner.model`: for a run that is the class vLLM's registry maps the target's
architecture to; without a run, each of the registry's common decoder families is tried. The path
from the model to `obj` (`model.model`, `model.get_language_model().model`, with `hasattr` guards)
is followed per architecture, so the report says for which architectures a name is missing, and a
wrapper that keeps its decoder one level deeper (`.language_model.model`) is named as such.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace
from pathlib import Path

from specops.analysis._checks import Finding, _File, _reader
from specops.analysis._index import DefTarget, ModuleIndex
from specops.analysis._instances import check_member_use, types_of
from specops.analysis._registry import registry_class
from specops.analysis._types import BoundMethod, ClassObject, Instance, Member, Missing, Scope, TypeReader, Value

# How a worker extension reaches the model vLLM built: `self.model_runner.model` / `.get_model()`.
MODEL_ROOTS = (("model_runner", "model"), ("model_runner", "get_model"))


@dataclass
class Binding:
    """`types.MethodType(function, obj)` found in `binder`, with what obj can be per architecture."""

    function: ast.FunctionDef
    binder: ast.FunctionDef | ast.AsyncFunctionDef
    line: int
    selves: list[Instance] = field(default_factory=list)
    extra_attrs: set[str] = field(default_factory=set)  # assigned on obj by the binder itself


@dataclass
class _Walk:
    checked: _File
    types: TypeReader
    model: Instance
    architecture: str
    findings: list[Finding] = field(default_factory=list)
    bindings: list[Binding] = field(default_factory=list)
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    recovered: list[str] = field(default_factory=list)

    # ---- values along the path to the model ------------------------------------------------------
    def value(self, expr: ast.expr, env: dict[str, list[Value]], scope: Scope, record: bool) -> list[Value]:
        if _is_root(expr):
            return [self.model]
        if isinstance(expr, ast.Name) and expr.id in env:
            return env[expr.id]
        if isinstance(expr, ast.Attribute):
            values: list[Value] = []
            for base in self.value(expr.value, env, scope, record):
                if not isinstance(base, Instance):
                    continue
                found = self.types.member(base, expr.attr)
                if isinstance(found, Member):
                    values += self.types.of_member(base, found)
                elif isinstance(found, Missing):
                    deeper = self._deeper(base, expr.attr)
                    if record:
                        self._missing(expr, base, found, deeper)
                    values += [v for _, v in deeper]
            return values
        if isinstance(expr, ast.Call):
            if isinstance(expr.func, ast.Attribute) and _is_root(expr.func):
                return [self.model]
            results: list[Value] = []
            for callee in self.value(expr.func, env, scope, record):
                if isinstance(callee, Instance):
                    continue
                if isinstance(callee, BoundMethod):
                    results += self.types.returns(callee)
            return results
        return self.types.of_expr(expr, Scope(scope.module, scope.self_type, scope.function, dict(env)))

    def _deeper(self, base: Instance, name: str) -> list[tuple[str, Instance]]:
        """Attributes of `base` whose value has `name`: where a wrapper keeps what was looked for."""
        found = []
        for attr, member in self.types.names(base).items():
            if member.kind != "attribute" or attr.startswith("_"):
                continue
            for inner in self.types.of_member(base, member):
                if isinstance(inner, Instance) and isinstance(self.types.member(inner, name), Member):
                    for value in self.types.of_member(inner, self.types.member(inner, name)):  # type: ignore[arg-type]
                        if isinstance(value, Instance):
                            found.append((f".{attr}.{name}", value))
        return found[:1]

    def _missing(self, expr: ast.Attribute, base: Instance, found: Missing, deeper: list[tuple[str, Instance]]) -> None:
        detail = f"[{self.architecture}] {found.reason}"
        if deeper:
            path, value = deeper[0]
            detail += (f"; {base.name} keeps it at {path.lstrip('.')} ({value.name}, "
                       f"{self.types.index.relative_path(value.cls.module)}:{value.cls.node.lineno})")
            self.recovered.append(path)
        self.findings.append(Finding("attribute", "error", str(self.checked.path), expr.lineno,
                                     self.checked.code(expr), f"{base.cls.qualname}.{expr.attr}", detail))

    # ---- conditions ----------------------------------------------------------------------------
    def truth(self, test: ast.expr, env: dict[str, list[Value]], scope: Scope) -> bool | None:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self.truth(test.operand, env, scope)
            return None if inner is None else not inner
        if isinstance(test, ast.BoolOp):
            results = []
            for part in test.values:  # short-circuit, as Python does: a guard protects what follows it
                result = self.truth(part, env, scope)
                results.append(result)
                if isinstance(test.op, ast.And) and result is False:
                    return False
                if isinstance(test.op, ast.Or) and result is True:
                    return True
            return None if None in results else isinstance(test.op, ast.And)
        if (isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "hasattr"
                and len(test.args) == 2 and isinstance(test.args[1], ast.Constant)):
            values = [v for v in self.value(test.args[0], env, scope, record=False) if isinstance(v, Instance)]
            answers = {_has(self.types, v, str(test.args[1].value)) for v in values}
            return answers.pop() if len(answers) == 1 else None
        return None

    # ---- statements ----------------------------------------------------------------------------
    def walk(self, body: list[ast.stmt], env: dict[str, list[Value]], scope: Scope) -> dict[str, list[Value]] | None:
        for stmt in body:
            self._bindings_in(stmt, env, scope)
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                env = {**env, stmt.targets[0].id: self.value(stmt.value, env, scope, record=True)}
            elif isinstance(stmt, ast.If):
                truth = self.truth(stmt.test, env, scope)
                branches = {True: [stmt.body], False: [stmt.orelse]}.get(truth, [stmt.body, stmt.orelse])
                live = [result for branch in branches if (result := self.walk(branch, env, scope)) is not None]
                if not live:
                    return None
                merged: dict[str, list[Value]] = {}
                for result in live:
                    for name, values in result.items():
                        merged[name] = merged.get(name, []) + [v for v in values if v not in merged.get(name, [])]
                env = merged
            elif isinstance(stmt, ast.Raise | ast.Return):
                return None
            elif isinstance(stmt, ast.With | ast.For | ast.While | ast.Try):
                for part in (stmt.body, getattr(stmt, "orelse", []), getattr(stmt, "finalbody", [])):
                    env = self.walk(part, env, scope) or env
        return env

    def _bindings_in(self, stmt: ast.stmt, env: dict[str, list[Value]], scope: Scope) -> None:
        if isinstance(stmt, ast.If | ast.With | ast.For | ast.While | ast.Try):
            return  # their bodies are walked statement by statement
        for node in ast.walk(stmt):
            if not (isinstance(node, ast.Call) and _is_method_type(node.func) and len(node.args) == 2):
                continue
            fn, obj = node.args
            function = self.functions.get(fn.id) if isinstance(fn, ast.Name) else None
            if function is None:
                continue
            selves = [v for v in self.value(obj, env, scope, record=False) if isinstance(v, Instance)]
            extra = set()
            if isinstance(obj, ast.Name):
                for other in ast.walk(scope.function) if scope.function else ():
                    if isinstance(other, ast.Assign):
                        for target in other.targets:
                            if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                                    and target.value.id == obj.id):
                                extra.add(target.attr)
            self.bindings.append(Binding(function, scope.function, node.lineno, selves, extra))  # type: ignore[arg-type]


def _is_root(expr: ast.expr) -> bool:
    return (isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Attribute)
            and (expr.value.attr, expr.attr) in MODEL_ROOTS)


def _is_method_type(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "MethodType" and isinstance(func.value, ast.Name)
            and func.value.id == "types") or (isinstance(func, ast.Name) and func.id == "MethodType")


def _has(types: TypeReader, value: Instance, name: str) -> bool | None:
    found = types.member(value, name)
    return True if isinstance(found, Member) else False if isinstance(found, Missing) else None


def files_binding_methods(files: list[Path], index: ModuleIndex) -> list[Path]:
    return [f for f in files if "MethodType" in (index.text(f) or "")]


def check_assigned_functions(path: Path, index: ModuleIndex) -> list[Finding]:
    """`SomeClass.method = fn`: inside `fn`, `self` is an instance of that class (or of a subclass, so
    a name it lacks is unknown, not an error)."""
    checked = _File(path, index)
    if checked.module is None:
        return []
    types, sigs = types_of(index), _reader(index)
    functions = {n.name: n for n in checked.tree.body if isinstance(n, ast.FunctionDef)}
    findings: list[Finding] = []
    for node in ast.walk(checked.tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in functions):
            continue
        for target in node.targets:
            if not isinstance(target, ast.Attribute):
                continue
            owners = [v for v in types.of_expr(target.value, Scope(checked.module)) if isinstance(v, ClassObject)]
            if owners:
                binding = Binding(functions[node.value.id], None, node.lineno,  # type: ignore[arg-type]
                                  [Instance(o.cls, False, f"assigned onto {o.cls.node.name}") for o in owners])
                findings.extend(_function_uses(checked, binding, owners[0].cls.node.name, types, sigs))
    return findings


def check_bound_functions(path: Path, index: ModuleIndex, architectures: list[str]) -> list[Finding]:
    """For each architecture: the path from the model to each `types.MethodType(fn, obj)`, and every
    name `fn` uses on `self`, checked on what obj is for that architecture."""
    checked = _File(path, index)
    if checked.module is None or "MethodType" not in (index.text(checked.path) or ""):
        return []
    types, sigs = types_of(index), _reader(index)
    functions = {n.name: n for n in checked.tree.body if isinstance(n, ast.FunctionDef)}
    methods = [(cls, m) for cls in ast.walk(checked.tree) if isinstance(cls, ast.ClassDef)
               for m in cls.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)
               and "MethodType" in ast.unparse(m)]
    findings: list[Finding] = []
    for architecture in architectures:
        model_cls = registry_class(index, architecture)
        if model_cls is None:
            findings.append(Finding("attribute", "unknown", str(checked.path), methods[0][1].lineno if methods else 1,
                                    "", architecture, f"[{architecture}] not in the installed vLLM's model registry"))
            continue
        model = Instance(model_cls, True, f"vLLM's registry entry {architecture}")
        for cls, method in methods:
            walk = _Walk(checked, types, model, architecture, functions=functions)
            me = Instance(DefTarget(checked.module, cls), exact=False)
            walk.walk(method.body, {}, Scope(checked.module, me, method))
            findings.extend(walk.findings)
            for binding in walk.bindings:
                findings.extend(_function_uses(checked, binding, architecture, types, sigs))
    return findings


def _function_uses(checked: _File, binding: Binding, architecture: str, types: TypeReader, sigs) -> list[Finding]:
    function = binding.function
    me = _first_arg(function)
    label = f"[{architecture}] "
    if not binding.selves:
        return [Finding("attribute", "unknown", str(checked.path), function.lineno, f"def {function.name}(...)",
                        function.name,
                        f"{label}what {function.name} is bound to (line {binding.line}) could not be typed")]
    calls = {id(n.func): n for n in ast.walk(function) if isinstance(n, ast.Call)}
    findings = []
    seen: set[tuple[int, str]] = set()
    for node in ast.walk(function):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == me):
            continue
        if not isinstance(node.ctx, ast.Load) or node.attr in binding.extra_attrs or (node.lineno, node.attr) in seen:
            continue
        seen.add((node.lineno, node.attr))
        finding = check_member_use(checked, node, calls.get(id(node)), list(binding.selves), types, sigs, label)
        if finding is not None:
            via = ", ".join(sorted({s.name for s in binding.selves}))
            findings.append(replace(finding, detail=f"{finding.detail} (self is {via}, bound at line {binding.line})"))
    return findings


def _first_arg(function: ast.FunctionDef) -> str | None:
    positional = [*function.args.posonlyargs, *function.args.args]
    return positional[0].arg if positional else None


__all__ = ["MODEL_ROOTS", "check_assigned_functions", "check_bound_functions", "files_binding_methods"]
