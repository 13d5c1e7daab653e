"""Call signatures read from source: functions, methods, classes, dataclasses, msgspec structs.

A signature is only produced when the source says for certain what the callable accepts; anything
that may change it (an unknown decorator, a metaclass, a base class out of reach) gives `Unknown`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from specops.analysis._index import DefTarget, ModuleIndex, ModuleTarget, Target, Unresolved

POSITIONAL_ONLY = "positional_only"
POSITIONAL_OR_KEYWORD = "positional_or_keyword"
KEYWORD_ONLY = "keyword_only"

# Decorators that leave a function's call signature as it was.
TRANSPARENT_DECORATORS = frozenset({
    "functools.cache", "functools.lru_cache", "functools.cached_property", "abc.abstractmethod",
    "typing.override", "typing_extensions.override", "typing.final", "typing_extensions.final",
    "typing_extensions.deprecated", "warnings.deprecated", "torch.no_grad", "torch.inference_mode",
    "torch.compile", "torch.jit.ignore", "torch.jit.unused",
})
# Class decorators that leave __init__ alone.
TRANSPARENT_CLASS_DECORATORS = frozenset({
    "typing.final", "typing_extensions.final", "typing.runtime_checkable",
    "typing_extensions.runtime_checkable", "functools.total_ordering", "typing_extensions.deprecated",
    "warnings.deprecated", "enum.unique",
})
DATACLASS_DECORATORS = {
    "dataclasses.dataclass": "std", "pydantic.dataclasses.dataclass": "pydantic",
    "pydantic.dataclass": "pydantic",
}
FIELD_FUNCTIONS = frozenset({"dataclasses.field", "pydantic.Field", "pydantic.fields.Field", "msgspec.field"})
STRUCT_BASES = frozenset({"msgspec.Struct"})


@dataclass(frozen=True)
class Param:
    name: str
    kind: str
    required: bool


@dataclass(frozen=True)
class Signature:
    qualname: str
    params: tuple[Param, ...]
    var_positional: bool
    var_keyword: bool
    where: str  # "vllm/v1/core/kv_cache_utils.py:1069"
    extra_keywords: str = "error"  # "error" | "unknown": pydantic models may ignore extras

    def describe(self) -> str:
        shown: list[str] = []
        keyword_marker = False
        for index, param in enumerate(self.params):
            if param.kind == KEYWORD_ONLY and not keyword_marker and not self.var_positional:
                shown.append("*")
                keyword_marker = True
            shown.append(param.name if param.required else f"{param.name}=…")
            after = self.params[index + 1] if index + 1 < len(self.params) else None
            if param.kind == POSITIONAL_ONLY and (after is None or after.kind != POSITIONAL_ONLY):
                shown.append("/")
        if self.var_positional:
            insert_at = next((i for i, s in enumerate(shown) if self._is_kwonly(s)), len(shown))
            shown.insert(insert_at, "*args")
        if self.var_keyword:
            shown.append("**kwargs")
        return f"{self.qualname}({', '.join(shown)}) at {self.where}"

    def _is_kwonly(self, shown: str) -> bool:
        name = shown.removesuffix("=…")
        return any(p.name == name and p.kind == KEYWORD_ONLY for p in self.params)


@dataclass(frozen=True)
class Unknown:
    qualname: str
    reason: str


@dataclass(frozen=True)
class _Field:
    name: str
    required: bool
    kw_only: bool


class SignatureReader:
    def __init__(self, index: ModuleIndex):
        self.index = index
        self._cache: dict[tuple[str, int], Signature | Unknown] = {}

    def of(self, target: Target) -> Signature | Unknown:
        """What calling `target` accepts."""
        if isinstance(target, Unresolved):
            return Unknown(target.qualname, target.reason)
        if isinstance(target, ModuleTarget):
            return Unknown(target.qualname, "a module is not callable")
        key = (target.qualname, target.node.lineno)
        if key not in self._cache:
            self._cache[key] = self._class(target) if target.is_class else self._function(target)
        return self._cache[key]

    def _where(self, target: DefTarget, node: ast.AST | None = None) -> str:
        return f"{self.index.relative_path(target.module)}:{(node or target.node).lineno}"

    # ---- functions -----------------------------------------------------------------------------
    def _function(self, target: DefTarget, qualname: str | None = None, drop_first: bool | None = None
                  ) -> Signature | Unknown:
        node = target.node
        assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        qualname = qualname or target.qualname
        method_kind = "function"
        for decorator in node.decorator_list:
            spelled = self.index.spelled(target.module, _callee_of(decorator)) or ast.unparse(decorator)
            if spelled in ("builtins.staticmethod", "builtins.classmethod"):
                method_kind = spelled.removeprefix("builtins.")
            elif spelled in ("builtins.property",) or spelled.endswith((".setter", ".getter", ".deleter")):
                return Unknown(qualname, "a property, not a call")
            elif spelled not in TRANSPARENT_DECORATORS and spelled != "typing.overload" and not (
                    self._returns_what_it_decorates(target.module, decorator)):
                return Unknown(qualname, f"decorated with @{ast.unparse(decorator)}, which may change "
                                         f"its signature ({self._where(target, node)})")
        if drop_first is None:
            # called through the class: a classmethod binds cls, a plain function binds nothing
            drop_first = target.owner is not None and method_kind == "classmethod"
        params = _parameters(node.args)
        if drop_first:
            if not params[0] and not node.args.vararg:
                return Unknown(qualname, "method without a self/cls parameter")
            params = params[0][1:], params[1]
        positional, keyword_only = params
        return Signature(qualname, tuple(positional + keyword_only), node.args.vararg is not None,
                         node.args.kwarg is not None, self._where(target, node))

    # ---- classes -------------------------------------------------------------------------------
    def _class(self, target: DefTarget) -> Signature | Unknown:
        node = target.node
        assert isinstance(node, ast.ClassDef)
        for keyword in node.keywords:
            if keyword.arg == "metaclass":
                spelled = self.index.spelled(target.module, keyword.value)
                if spelled not in ("abc.ABCMeta",):
                    return Unknown(target.qualname, f"metaclass {ast.unparse(keyword.value)} may change "
                                                    "construction")
        for klass in self.index.iter_mro(target):
            if isinstance(klass, Unresolved):
                if klass.qualname == "builtins.object":
                    continue
                return Unknown(target.qualname, f"base class {klass.qualname} could not be read: {klass.reason}")
            assert isinstance(klass.node, ast.ClassDef)
            decorated = self._class_decorators(klass)
            if isinstance(decorated, Unknown):
                return Unknown(target.qualname, decorated.reason)
            struct = self._struct_flavour(klass)
            if isinstance(struct, Unknown):
                return Unknown(target.qualname, struct.reason)
            own = {stmt.name: stmt for stmt in klass.node.body
                   if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef)}
            if "__init__" in own:
                return self._method_of(klass, own["__init__"], target.qualname)
            if decorated is not None and decorated[1]:  # a dataclass that writes its own __init__
                return self._dataclass(target, klass, decorated[0])
            if struct is not None:
                return self._dataclass(target, klass, struct)
            if "__new__" in own:
                return self._method_of(klass, own["__new__"], target.qualname)
        return Signature(target.qualname, (), False, False, self._where(target))

    def _method_of(self, klass: DefTarget, node: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str
                   ) -> Signature | Unknown:
        found = self._function(DefTarget(klass.module, node, klass), qualname=qualname, drop_first=True)
        if isinstance(found, Signature):
            return Signature(found.qualname, found.params, found.var_positional, found.var_keyword,
                             f"{found.where} ({klass.node.name}.{node.name})")
        return found

    def _class_decorators(self, klass: DefTarget) -> tuple[str, bool] | Unknown | None:
        """(flavour, writes __init__) for a dataclass, None for a plain class, Unknown otherwise."""
        result: tuple[str, bool] | None = None
        for decorator in klass.node.decorator_list:  # type: ignore[union-attr]
            spelled = self.index.spelled(klass.module, _callee_of(decorator))
            # known names first: resolving `dataclasses.dataclass` would parse the standard library
            flavour = DATACLASS_DECORATORS.get(spelled or "")
            if spelled in TRANSPARENT_CLASS_DECORATORS or (
                    flavour is None and self._returns_what_it_decorates(klass.module, decorator)):
                continue
            flavour = flavour or self._dataclass_wrapper(klass, decorator)
            if flavour is None:
                return Unknown(klass.qualname, f"class decorator @{ast.unparse(decorator)} may change its "
                                               f"__init__ ({self._where(klass)})")
            writes_init = not any(k.arg == "init" and _is_false(k.value) for k in _keywords(decorator))
            result = (flavour, writes_init)
        return result

    def _returns_what_it_decorates(self, module: str, decorator: ast.expr) -> bool:
        """True for decorators that only annotate (docstrings, registries): every `return` in the
        function that receives the decorated object returns that object itself."""
        callee = self.index.expression(module, _callee_of(decorator))
        if not isinstance(callee, DefTarget) or callee.is_class:
            return False
        receiver = callee.node
        if isinstance(decorator, ast.Call):  # a factory: the decorator is the function it returns
            inner = [n for n in receiver.body if isinstance(n, ast.FunctionDef)]  # type: ignore[union-attr]
            if len(inner) != 1:
                return False
            receiver = inner[0]
        args = receiver.args  # type: ignore[union-attr]
        positional = [*args.posonlyargs, *args.args]
        if len(positional) != 1 or args.vararg or args.kwarg:
            return False
        name = positional[0].arg
        returns = [n for n in own_nodes(receiver) if isinstance(n, ast.Return)]
        return bool(returns) and all(isinstance(r.value, ast.Name) and r.value.id == name for r in returns)

    def _dataclass_wrapper(self, klass: DefTarget, decorator: ast.expr) -> str | None:
        """A project's own decorator that only wraps a dataclass decorator (vLLM's `@config`)."""
        callee = self.index.expression(klass.module, _callee_of(decorator))
        if not isinstance(callee, DefTarget) or callee.is_class:
            return None
        flavours = set()
        forbids_extra = False
        for node in ast.walk(callee.node):
            if isinstance(node, ast.Call):
                spelled = self.index.spelled(callee.module, node.func)
                if spelled in DATACLASS_DECORATORS:
                    flavours.add(DATACLASS_DECORATORS[spelled])
            if isinstance(node, ast.keyword) and node.arg == "extra" and _constant(node.value) == "forbid":
                forbids_extra = True
        if len(flavours) != 1:
            return None
        flavour = flavours.pop()
        return "pydantic-forbid" if flavour == "pydantic" and forbids_extra else flavour

    def _struct_flavour(self, klass: DefTarget) -> str | Unknown | None:
        for base in klass.node.bases:  # type: ignore[union-attr]
            if self.index.spelled(klass.module, base) in STRUCT_BASES:
                return "msgspec"
        return None

    # ---- dataclass-like field lists ------------------------------------------------------------
    def _dataclass(self, target: DefTarget, klass: DefTarget, flavour: str) -> Signature | Unknown:
        fields: dict[str, _Field] = {}
        chain = [k for k in self.index.mro(klass) if not (isinstance(k, Unresolved)
                                                           and k.qualname == "builtins.object")]
        for ancestor in reversed(chain):
            if isinstance(ancestor, Unresolved):
                if self._is_struct_root(ancestor):
                    continue
                return Unknown(target.qualname, f"base class {ancestor.qualname} could not be read")
            is_fields_class = ancestor is klass or self._declares_fields(ancestor)
            if not is_fields_class:
                continue
            for found in self._own_fields(ancestor, flavour):
                if isinstance(found, Unknown):
                    return Unknown(target.qualname, found.reason)
                fields[found.name] = found  # a redefined field keeps its place, takes the new default
        params = [Param(f.name, KEYWORD_ONLY if f.kw_only else POSITIONAL_OR_KEYWORD, f.required)
                  for f in fields.values() if not f.kw_only]
        params += [Param(f.name, KEYWORD_ONLY, f.required) for f in fields.values() if f.kw_only]
        extra = "unknown" if flavour == "pydantic" else "error"
        return Signature(target.qualname, tuple(params), False, False, f"{self._where(klass)} ({flavour} fields)",
                         extra_keywords=extra)

    def _is_struct_root(self, base: Unresolved) -> bool:
        return base.qualname in STRUCT_BASES or base.qualname.startswith("msgspec.")

    def _declares_fields(self, klass: DefTarget) -> bool:
        decorated = self._class_decorators(klass)
        return (isinstance(decorated, tuple)) or self._struct_flavour(klass) == "msgspec"

    def _own_fields(self, klass: DefTarget, flavour: str) -> list[_Field | Unknown]:
        node = klass.node
        assert isinstance(node, ast.ClassDef)
        kw_only_all = any(k.arg == "kw_only" and not _is_false(k.value)
                          for d in node.decorator_list for k in _keywords(d))
        kw_only_all = kw_only_all or any(k.arg == "kw_only" and not _is_false(k.value) for k in node.keywords)
        found: list[_Field | Unknown] = []
        kw_only = kw_only_all
        for stmt in node.body:
            if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                continue
            annotation = self.index.spelled(klass.module, _origin(stmt.annotation)) or ""
            if annotation.endswith("ClassVar"):
                continue
            if annotation in ("dataclasses.KW_ONLY",):
                kw_only = True
                continue
            name = stmt.target.id
            if flavour == "msgspec" and name.startswith("__"):
                continue
            value = stmt.value
            required, field_kw_only = value is None, kw_only
            if isinstance(value, ast.Call) and self.index.spelled(klass.module, value.func) in FIELD_FUNCTIONS:
                keywords = {k.arg: k.value for k in value.keywords if k.arg}
                if any(k.arg is None for k in value.keywords):
                    found.append(Unknown(klass.qualname, f"field {name} built from **kwargs"))
                    continue
                if "init" in keywords and _is_false(keywords["init"]):
                    continue
                if "alias" in keywords or "validation_alias" in keywords:
                    found.append(Unknown(klass.qualname, f"field {name} has an alias"))
                    continue
                positional_default = value.args and not _is_ellipsis(value.args[0])
                required = not ("default" in keywords or "default_factory" in keywords or positional_default)
                if "default" in keywords and _is_ellipsis(keywords["default"]):
                    required = True
                if "kw_only" in keywords:
                    field_kw_only = not _is_false(keywords["kw_only"])
            found.append(_Field(name, required, field_kw_only))
        return found


def _parameters(args: ast.arguments) -> tuple[list[Param], list[Param]]:
    positional = [*args.posonlyargs, *args.args]
    first_default = len(positional) - len(args.defaults)
    params = [Param(arg.arg, POSITIONAL_ONLY if i < len(args.posonlyargs) else POSITIONAL_OR_KEYWORD,
                    i < first_default) for i, arg in enumerate(positional)]
    keyword_only = [Param(arg.arg, KEYWORD_ONLY, default is None)
                    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    return params, keyword_only


def _callee_of(decorator: ast.expr) -> ast.expr:
    return decorator.func if isinstance(decorator, ast.Call) else decorator


def _keywords(decorator: ast.expr) -> list[ast.keyword]:
    return decorator.keywords if isinstance(decorator, ast.Call) else []


def _origin(annotation: ast.expr) -> ast.expr:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return annotation
    return annotation.value if isinstance(annotation, ast.Subscript) else annotation


def _constant(node: ast.expr) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _is_false(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _is_ellipsis(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is Ellipsis


def own_nodes(function: ast.AST) -> list[ast.AST]:
    """Nodes of a function body, not those of functions nested in it."""
    found: list[ast.AST] = []
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        found.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))
    return found
