"""What an expression is an instance of, read from source: constructors, `self.x = ...`, annotations,
return annotations. Enough to bind `self.scheduler.schedule()` to `Scheduler.schedule`.

A type is `exact` when we saw the constructor call (no subclass or mixin can add attributes), so a
name it lacks is certainly missing. Anything else typed from an annotation may be a subclass: a name
it lacks there is "unknown", never an error.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field

from specops.analysis._index import DefTarget, ModuleIndex, Unresolved
from specops.analysis._signatures import own_nodes

# torch's Module.__getattr__ answers only what was assigned on the instance (submodules, parameters,
# buffers): assignments we read. Any other class's __getattr__ may answer anything.
SELF_ASSIGNED_GETATTR = frozenset({"torch.nn.modules.module.Module"})
# Calls that create the named attribute on `self`: register_buffer("name", ...) and friends.
REGISTERING_METHODS = frozenset({"register_buffer", "register_parameter", "add_module", "register_module"})
# Functions that build a model from vLLM's registry by architecture name (`architectures=[...]`).
REGISTRY_CONSTRUCTORS = frozenset({"init_vllm_registered_model"})
MAX_DEPTH = 8


@dataclass(frozen=True)
class Instance:
    cls: DefTarget
    exact: bool  # built by a constructor we read: nothing can add attributes behind our back
    via: str = ""  # how it was typed, for messages

    @property
    def name(self) -> str:
        return self.cls.node.name


@dataclass(frozen=True)
class ClassObject:
    cls: DefTarget


@dataclass(frozen=True)
class BoundMethod:
    instance: Instance
    node: ast.FunctionDef | ast.AsyncFunctionDef
    owner: DefTarget


Value = Instance | ClassObject | BoundMethod


@dataclass(frozen=True)
class Member:
    """A name found on a class or instance."""

    kind: str  # "method" | "attribute" | "class"
    owner: DefTarget
    node: ast.AST  # the def, or the assigning statement
    value: ast.expr | None = None  # assigned value, if one expression
    annotation: ast.expr | None = None
    method: ast.FunctionDef | ast.AsyncFunctionDef | None = None  # where a self attribute is assigned

    @property
    def where(self) -> str:
        return f"{self.owner.module.replace('.', '/')}.py:{getattr(self.node, 'lineno', 0)}"


@dataclass(frozen=True)
class Missing:
    reason: str


@dataclass(frozen=True)
class Doubt:
    reason: str


Lookup = Member | Missing | Doubt


@dataclass
class _ClassTable:
    methods: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = field(default_factory=dict)
    class_attrs: dict[str, Member] = field(default_factory=dict)
    self_attrs: dict[str, list[Member]] = field(default_factory=dict)
    dynamic: str | None = None  # why any name may exist


def _is_overload(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any((isinstance(d, ast.Name) and d.id == "overload")
               or (isinstance(d, ast.Attribute) and d.attr == "overload") for d in node.decorator_list)


def _self_name(method: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    for decorator in method.decorator_list:
        if isinstance(decorator, ast.Name) and decorator.id in ("staticmethod", "classmethod"):
            return None
    positional = [*method.args.posonlyargs, *method.args.args]
    return positional[0].arg if positional else None


def annotation_origin(annotation: ast.expr | None) -> ast.expr | None:
    """`Scheduler` for `Scheduler`, `"Scheduler"`, `Scheduler | None`, `Optional[Scheduler]`."""
    if annotation is None:
        return None
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        sides = [s for s in (annotation.left, annotation.right)
                 if not (isinstance(s, ast.Constant) and s.value is None)]
        return annotation_origin(sides[0]) if len(sides) == 1 else None
    if isinstance(annotation, ast.Subscript):
        head = annotation.value
        head_name = getattr(head, "id", None) or getattr(head, "attr", "")
        if isinstance(head, ast.Name | ast.Attribute) and head_name == "Optional":
            return annotation_origin(annotation.slice)
        return None  # list[X], dict[...]: a container, not an X
    return annotation if isinstance(annotation, ast.Name | ast.Attribute) else None


class TypeReader:
    """Types of expressions in installed source, with class attribute tables cached per class."""

    def __init__(self, index: ModuleIndex, registry: Callable[[str], DefTarget | None] | None = None):
        self.index = index
        self.registry = registry  # architecture name -> vLLM model class
        self._tables: dict[int, _ClassTable] = {}

    # ---- class tables --------------------------------------------------------------------------
    def table(self, cls: DefTarget) -> _ClassTable:
        key = id(cls.node)
        if key not in self._tables:
            self._tables[key] = self._build_table(cls)
        return self._tables[key]

    def _build_table(self, cls: DefTarget) -> _ClassTable:
        table = _ClassTable()
        node = cls.node
        assert isinstance(node, ast.ClassDef)
        for stmt in node.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                table.methods.setdefault(stmt.name, []).append(stmt)
            elif isinstance(stmt, ast.ClassDef):
                table.class_attrs[stmt.name] = Member("class", cls, stmt)
            elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                annotation = stmt.annotation if isinstance(stmt, ast.AnnAssign) else None
                for target in targets:
                    for name_node in ast.walk(target):
                        if isinstance(name_node, ast.Name):
                            single = stmt.value if isinstance(target, ast.Name) else None
                            table.class_attrs[name_node.id] = Member("attribute", cls, stmt, single, annotation)
        if "__getattr__" in table.methods and cls.qualname not in SELF_ASSIGNED_GETATTR:
            table.dynamic = f"{cls.qualname} defines __getattr__"
        for methods in table.methods.values():
            for method in methods:
                self._scan_self_assignments(cls, method, table)
        return table

    def _scan_self_assignments(self, cls: DefTarget, method: ast.FunctionDef | ast.AsyncFunctionDef,
                               table: _ClassTable) -> None:
        me = _self_name(method)
        if me is None:
            return

        def add(name: str, stmt: ast.AST, value: ast.expr | None, annotation: ast.expr | None) -> None:
            table.self_attrs.setdefault(name, []).append(Member("attribute", cls, stmt, value, annotation, method))

        for node in ast.walk(method):
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    single = isinstance(target, ast.Attribute)
                    for part in ast.walk(target):
                        if (isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name)
                                and part.value.id == me and isinstance(part.ctx, ast.Store)):
                            add(part.attr, node, node.value if single else None,
                                node.annotation if isinstance(node, ast.AnnAssign) else None)
            elif isinstance(node, ast.Call):
                func = node.func
                # setattr(self, "x", v) and object.__setattr__(self, "x", v) (frozen dataclasses)
                sets = (isinstance(func, ast.Name) and func.id == "setattr") or (
                    isinstance(func, ast.Attribute) and func.attr == "__setattr__")
                if sets and node.args and _is_name(node.args[0], me):
                    named = len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                    if named and isinstance(node.args[1].value, str):
                        add(node.args[1].value, node, node.args[2] if len(node.args) > 2 else None, None)
                    elif cls.qualname not in SELF_ASSIGNED_GETATTR:
                        table.dynamic = table.dynamic or (
                            f"setattr(self, ...) with a computed name at line {node.lineno}")
                elif (isinstance(func, ast.Attribute) and _is_name(func.value, me) and func.attr in REGISTERING_METHODS
                      and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                    add(node.args[0].value, node, None, None)
            elif (isinstance(node, ast.Attribute) and _is_name(node.value, me) and node.attr == "__dict__"
                  and cls.qualname not in SELF_ASSIGNED_GETATTR):
                table.dynamic = table.dynamic or f"self.__dict__ is used at line {node.lineno}"

    # ---- lookups -------------------------------------------------------------------------------
    def member(self, value: Instance | ClassObject, name: str) -> Lookup:
        """`name` on an instance (its class, bases and what methods assign on self) or on a class."""
        on_instance = isinstance(value, Instance)
        cls = value.cls
        for klass in self.index.iter_mro(cls):
            if isinstance(klass, Unresolved):
                if klass.qualname == "builtins.object":
                    continue
                return Doubt(f"base class {klass.qualname} of {cls.node.name} could not be read ({klass.reason})")
            table = self.table(klass)
            if name in table.methods:
                defs = table.methods[name]
                real = [d for d in defs if not _is_overload(d)] or defs
                return Member("method", klass, real[-1])
            if name in table.class_attrs:
                return table.class_attrs[name]
            if on_instance and name in table.self_attrs:
                return table.self_attrs[name][0]
            if table.dynamic:
                return Doubt(table.dynamic)
        if not on_instance or not value.exact:
            return Doubt(f"{cls.node.name} does not define '{name}'; a subclass or mixin may")
        return Missing(f"{cls.node.name} ({self.index.relative_path(cls.module)}:{cls.node.lineno}) has no "
                       f"attribute '{name}'")

    def all_assignments(self, value: Instance, name: str) -> list[Member]:
        for klass in self.index.iter_mro(value.cls):
            if isinstance(klass, Unresolved):
                return []
            found = self.table(klass).self_attrs.get(name)
            if found:
                return found
        return []

    def names(self, value: Instance) -> dict[str, Member]:
        """Every name an instance has that we can read (for suggestions), nearest class first."""
        found: dict[str, Member] = {}
        for klass in self.index.iter_mro(value.cls):
            if isinstance(klass, Unresolved):
                continue
            table = self.table(klass)
            for name, defs in table.methods.items():
                found.setdefault(name, Member("method", klass, ([d for d in defs if not _is_overload(d)] or defs)[-1]))
            for name, member in table.class_attrs.items():
                found.setdefault(name, member)
            for name, members in table.self_attrs.items():
                found.setdefault(name, members[0])
        return found

    # ---- types of expressions ------------------------------------------------------------------
    def of_annotation(self, module: str, annotation: ast.expr | None, via: str) -> list[Value]:
        origin = annotation_origin(annotation)
        if origin is None:
            return []
        target = self.index.expression(module, origin)
        if isinstance(target, DefTarget) and target.is_class:
            return [Instance(target, False, via)]
        return []

    def of_member(self, owner: Instance | ClassObject, member: Member, depth: int = 0) -> list[Value]:
        if member.kind == "method":
            if isinstance(owner, Instance):
                return [BoundMethod(owner, member.node, member.owner)]  # type: ignore[arg-type]
            return []
        if member.kind == "class":
            return [ClassObject(DefTarget(member.owner.module, member.node, member.owner))]  # type: ignore[arg-type]
        values: list[Value] = []
        if member.annotation is not None:
            values += self.of_annotation(member.owner.module, member.annotation, f"annotated at {member.where}")
        if not values and member.value is not None and depth < MAX_DEPTH:
            scope = Scope(member.owner.module, owner if isinstance(owner, Instance) else None, member.method)
            values += self.of_expr(member.value, scope, depth + 1)
        if not values and isinstance(owner, Instance) and member.method is not None and depth < MAX_DEPTH:
            # `if pp: self.norm = RMSNorm(...) else: self.norm = PPMissingLayer()`: every assignment counts
            for other in self.all_assignments(owner, _attr_name(member)):
                if other is not member and other.value is not None:
                    values += self.of_expr(other.value, Scope(other.owner.module, owner, other.method), depth + 1)
        return _unique(values)

    def of_expr(self, expr: ast.expr, scope: Scope, depth: int = 0) -> list[Value]:
        if depth > MAX_DEPTH:
            return []
        if isinstance(expr, ast.Name):
            if scope.self_type is not None and scope.self_name == expr.id:
                return [scope.self_type]
            if expr.id in scope.locals:
                return scope.locals[expr.id]
            if scope.function is not None and _is_local(scope.function, expr.id):
                return []
            target = self.index.expression(scope.module, expr)
            if isinstance(target, DefTarget) and target.is_class:
                return [ClassObject(target)]
            return []
        if isinstance(expr, ast.Attribute):
            values: list[Value] = []
            for base in self.of_expr(expr.value, scope, depth + 1):
                if isinstance(base, Instance | ClassObject):
                    found = self.member(base, expr.attr)
                    if isinstance(found, Member):
                        values += self.of_member(base, found, depth + 1)
            untyped_base = isinstance(expr.value, ast.Name | ast.Attribute) and not self.of_expr(
                expr.value, scope, depth + 1)
            if not values and untyped_base:
                target = self.index.expression(scope.module, expr) if _dotted(expr) else None
                if isinstance(target, DefTarget) and target.is_class:
                    values.append(ClassObject(target))
            return _unique(values)
        if isinstance(expr, ast.Call):
            return self.of_call(expr, scope, depth)
        if isinstance(expr, ast.IfExp):
            return _unique(self.of_expr(expr.body, scope, depth + 1) + self.of_expr(expr.orelse, scope, depth + 1))
        return []

    def of_call(self, call: ast.Call, scope: Scope, depth: int) -> list[Value]:
        callee = call.func
        name = callee.attr if isinstance(callee, ast.Attribute) else callee.id if isinstance(callee, ast.Name) else ""
        if name in REGISTRY_CONSTRUCTORS and self.registry is not None:
            built = self._from_registry(call)
            if built:
                return built
        values: list[Value] = []
        for value in self.of_expr(callee, scope, depth + 1):
            if isinstance(value, ClassObject):
                values.append(Instance(value.cls, True, f"{value.cls.node.name}(...) at line {call.lineno}"))
            elif isinstance(value, BoundMethod):
                values += self.returns(value, depth + 1)
        return _unique(values)

    def _from_registry(self, call: ast.Call) -> list[Value]:
        for keyword in call.keywords:
            if keyword.arg == "architectures" and isinstance(keyword.value, ast.List | ast.Tuple):
                names = [e.value for e in keyword.value.elts
                         if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                built = [self.registry(n) for n in names]  # type: ignore[misc]
                return [Instance(c, True, f"vLLM's registry entry {n}") for c, n in zip(built, names, strict=True) if c]
        return []

    def returns(self, method: BoundMethod, depth: int = 0) -> list[Value]:
        """What calling a bound method gives: `return self.x` / `return Cls(...)` read from its body,
        else its return annotation (a base type: may be a subclass)."""
        node = method.node
        scope = Scope(method.owner.module, method.instance, node)
        found: list[Value] = []
        returns = [n for n in own_nodes(node) if isinstance(n, ast.Return) and n.value is not None]
        if returns and depth < MAX_DEPTH:
            for ret in returns:
                found += self.of_expr(ret.value, scope, depth + 1)  # type: ignore[arg-type]
        if not found and node.name == "get_language_model":
            found += self._marked_language_model(method.instance, depth)
        if not found:
            found += self.of_annotation(method.owner.module, node.returns, f"return annotation of {node.name}")
        return _unique(found)

    def _marked_language_model(self, instance: Instance, depth: int) -> list[Value]:
        """vLLM's default get_language_model returns what `__init__` assigned inside
        `with self._mark_language_model(...)`: read that assignment."""
        init = self.member(instance, "__init__")
        if not isinstance(init, Member) or init.kind != "method":
            return []
        me = _self_name(init.node)  # type: ignore[arg-type]
        for node in ast.walk(init.node):
            if isinstance(node, ast.With) and any(
                    isinstance(item.context_expr, ast.Call) and isinstance(item.context_expr.func, ast.Attribute)
                    and item.context_expr.func.attr == "_mark_language_model" for item in node.items):
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Attribute) and _is_name(
                            stmt.targets[0].value, me):
                        found = self.member(instance, stmt.targets[0].attr)
                        if isinstance(found, Member):
                            return self.of_member(instance, found, depth + 1)
        return []


@dataclass
class Scope:
    """Where an expression is evaluated: its module, what `self` is, the function's own locals."""

    module: str
    self_type: Instance | None = None
    function: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    locals: dict[str, list[Value]] = field(default_factory=dict)

    @property
    def self_name(self) -> str | None:
        return _self_name(self.function) if self.function is not None else "self"


def _attr_name(member: Member) -> str:
    node = member.node
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute):
                return target.attr
    return ""


def _is_name(node: ast.AST, name: str | None) -> bool:
    return name is not None and isinstance(node, ast.Name) and node.id == name


def _dotted(expr: ast.expr) -> bool:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return isinstance(expr, ast.Name)


def _is_local(function: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
    args = function.args
    if any(a.arg == name for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a):
        return True
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(function))


def _unique(values: list[Value]) -> list[Value]:
    seen: list[Value] = []
    keys: set[tuple] = set()
    for value in values:
        node = value.node if isinstance(value, BoundMethod) else value.cls.node
        key = (type(value).__name__, id(node), getattr(value, "exact", None))
        if key not in keys:
            keys.add(key)
            seen.append(value)
    return seen
