"""vLLM's training-free speculators (n-gram prompt lookup, suffix decoding) against the serve env: whether the
installed vLLM offers each method and whether what the method needs is installed, before any load.

Read from the release's own vllm/config/speculative.py, not listed here: the method names are the string
literals of its `SpeculativeMethod` (following the Literal aliases it is built from); what a method needs is
what the branch `self.method == "<name>"` of SpeculativeConfig checks, followed one call deep into the
config's own `self._validate_*` methods: a `has_X()` of vllm.utils.import_utils, whose body names the module
(`_has_module("arctic_inference")`), and the install line of the ImportError it raises without it. vLLM 0.32's
suffix decoding needs `arctic_inference` (PyPI arctic-inference), an optional package its CPU build does not
install. The settings a method takes are the fields SpeculativeConfig declares (`Support.settings`): a caller that
sets one (evaluate --compare turns suffix decoding's global tree off) checks it against this release first.
Standard library only; nothing is imported.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from specops.analysis import ModuleIndex
from specops.doctor._report import Item

SPECULATIVE = "vllm.config.speculative"
IMPORT_UTILS = "vllm.utils.import_utils"
TRAINING_FREE = ("ngram", "suffix")


@dataclass(frozen=True)
class Support:
    """One training-free method in the serve env: servable True/False (None: the source does not say)."""

    method: str
    servable: bool | None
    why: str  # one line: what was found
    fix: str = ""
    where: str = "vllm/config/speculative.py"
    # the field names SpeculativeConfig declares in this release (its --speculative-config keys); empty: not read
    settings: frozenset[str] = frozenset()


def _literal_names(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level assignments NAME = <expr> (the Literal aliases)."""
    found: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            found[node.target.id] = node.value
    return found


def offered_methods(tree: ast.Module) -> set[str] | None:
    """The strings of `SpeculativeMethod = Literal[...]`, aliases followed; None when the file has none."""
    names = _literal_names(tree)
    if "SpeculativeMethod" not in names:
        return None
    methods: set[str] = set()
    seen: set[str] = set()

    def collect(node: ast.expr) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            methods.add(node.value)
        elif isinstance(node, ast.Name) and node.id in names and node.id not in seen:
            seen.add(node.id)
            collect(names[node.id])
        elif isinstance(node, ast.Subscript):
            collect(node.slice)
        elif isinstance(node, ast.Tuple | ast.List):
            for element in node.elts:
                collect(element)

    collect(names["SpeculativeMethod"])
    return methods


def config_fields(tree: ast.Module) -> frozenset[str]:
    """The annotated fields of `class SpeculativeConfig` (the keys its --speculative-config takes)."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "SpeculativeConfig":
            return frozenset(item.target.id for item in node.body
                             if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name))
    return frozenset()


def _compares_method(test: ast.expr, method: str) -> bool:
    """`self.method == "<method>"` (or `in (..., "<method>", ...)`)."""
    if not (isinstance(test, ast.Compare) and isinstance(test.left, ast.Attribute) and test.left.attr == "method"):
        return False
    for comparator in test.comparators:
        values = comparator.elts if isinstance(comparator, ast.Tuple | ast.List | ast.Set) else [comparator]
        if any(isinstance(value, ast.Constant) and value.value == method for value in values):
            return True
    return False


def _branch_calls(tree: ast.Module, method: str) -> list[ast.Call]:
    """The calls in SpeculativeConfig's branches on `self.method == method`, and in the `self._x()` they call."""
    functions = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    calls: list[ast.Call] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _compares_method(node.test, method):
            for statement in node.body:
                calls += [call for call in ast.walk(statement) if isinstance(call, ast.Call)]
    for call in list(calls):
        func = call.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" \
                and func.attr in functions:
            calls += [inner for inner in ast.walk(functions[func.attr]) if isinstance(inner, ast.Call)]
    return calls


def _module_checked(index: ModuleIndex, helper: str) -> str | None:
    """The module a `has_X()` of vllm.utils.import_utils looks for: its `_has_module("...")` argument."""
    file = index.module_file(IMPORT_UTILS)
    tree = index.tree(file) if file is not None else None
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.FunctionDef) and node.name == helper:
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Constant) \
                        and isinstance(call.args[0].value, str) and isinstance(call.func, ast.Name) \
                        and call.func.id.startswith("_has_module"):
                    return call.args[0].value
    return None


def _install_hint(calls: list[ast.Call]) -> str:
    """The `pip install ...` line of the ImportError the method raises without its package, as vLLM words it."""
    for call in calls:
        if isinstance(call.func, ast.Name) and call.func.id == "ImportError":
            text = "".join(arg.value for arg in call.args if isinstance(arg, ast.Constant) and isinstance(arg.value,
                                                                                                          str))
            if "pip install" in text:
                return text[text.index("pip install"):].strip().strip("`.")
    return ""


def method_support(index: ModuleIndex, method: str) -> Support:
    """Whether the vLLM on the index's path serves `method`, and what it needs that is missing."""
    file = index.module_file(SPECULATIVE)
    tree = index.tree(file) if file is not None else None
    if tree is None:
        return Support(method, None, f"no {SPECULATIVE} to read (no vLLM, or one too old to have it)")
    offered = offered_methods(tree)
    if offered is None:
        return Support(method, None, "vllm/config/speculative.py has no SpeculativeMethod to read the methods from")
    if method not in offered:
        return Support(method, False, f"this vLLM offers no speculative method {method!r} "
                                      f"(SpeculativeMethod: {', '.join(sorted(offered))})")
    settings = config_fields(tree)
    calls = _branch_calls(tree, method)
    for call in calls:
        if isinstance(call.func, ast.Name) and call.func.id.startswith("has_"):
            module = _module_checked(index, call.func.id)
            if module is None:
                return Support(method, None, f"method {method} checks {call.func.id}() and what it looks for "
                                             "could not be read")
            if index.module_file(module) is None:
                hint = _install_hint(calls)
                return Support(method, False, f"method {method} needs the module {module} ({call.func.id}() in its "
                                              f"validation), not installed in the serve env",
                               fix=f"{hint or 'install ' + module} in the serve env (inventory envs.serve)",
                               settings=settings)
    return Support(method, True, f"method {method} offered, nothing it checks for is missing", settings=settings)


def training_free_support(search_path: list[str]) -> dict[str, Support]:
    """{method: Support} for vLLM's training-free speculators (ngram, suffix) on `search_path` (the serve env)."""
    index = ModuleIndex(search_path)
    return {method: method_support(index, method) for method in TRAINING_FREE}


def training_free_items(index: ModuleIndex) -> list[Item]:
    """The doctor's lines: what `evaluate --compare` can serve without training. A method that cannot be served
    is a warning, not an error: no step of a run needs it; the comparison reports it as not servable."""
    items = []
    for method in TRAINING_FREE:
        support = method_support(index, method)
        result = {True: "ok", False: "warn", None: "unknown"}[support.servable]
        why = f"{support.why}: `evaluate --compare` reports {method} as not servable" if support.servable is False \
            else support.why
        items.append(Item("serving", result, f"{support.where} ({method})", why, support.fix))
    return items
