"""Check `draft`: can the installed speculators train the run's kind of draft (`draft.method`), and can the host's
vLLM serve it? Read from their files, nothing imported, no list of versions:

- speculators trains the kinds its `SpeculatorModel` registry holds: `speculators train --speculator-type X` looks X
  up there (train/cli.py); the registry imports every module of its `auto_package` (speculators/model.py) and each
  kind registers itself with `@SpeculatorModel.register("X")` (models/X/core.py in 0.9.0);
- vLLM serves a speculators draft through its speculators-config loader: the kinds `@register_speculator("X")` names
  in vllm/transformers_utils/configs/speculators/algos.py, each under the speculative method its
  `build_vllm_speculative_config` (base.py) gives it (peagle -> eagle3 with parallel drafting, dflash2 -> dflash in
  0.32), which must be one of the names `SpeculativeMethod` (vllm/config/speculative.py) accepts.

- on a host whose vLLM runs Model Runner V1 (the CPU build: its CPUModelRunner subclasses V1's GPUModelRunner), what
  `VllmConfig._get_v1_model_runner_unsupported_features` (vllm/config/vllm.py) refuses: in 0.32 the method dspark
  and DFlash drafts with a candidate head (the architecture the loader gives dflash2), at the server's start.

A pair that cannot (xpress or mtp on vLLM 0.32, whose loader has neither; dspark and dflash2 on its CPU build; P-EAGLE
on a vLLM whose loader dropped it) is one line; the run's entry refuses it (exit 2) before any step, the doctor's
document has it as an error.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specops.analysis import ModuleIndex
from specops.doctor._report import Item
from specops.doctor._training_free import offered_methods

SPECULATORS_MODEL = "speculators.model"
ALGOS = "vllm.transformers_utils.configs.speculators.algos"
BASE = "vllm.transformers_utils.configs.speculators.base"
SPECULATIVE = "vllm.config.speculative"
VLLM_CONFIG = "vllm.config.vllm"
CPU_RUNNER = "vllm.v1.worker.cpu_model_runner"
V1_RUNNER = "vllm.v1.worker.gpu_model_runner"  # Model Runner V1 (V2 lives in vllm/v1/worker/gpu/)
# What vLLM's loader functions may use when run here on a plain dict (they build dicts and raise).
_BUILTINS = ("ValueError", "KeyError", "TypeError", "IndexError", "isinstance", "list", "dict", "len", "str", "int",
             "bool", "getattr", "sorted", "tuple", "set")


@dataclass(frozen=True)
class KindReading:
    """What the installed files say about one kind of draft; None where a side could not be read."""

    kind: str
    trained: dict[str, str] | None  # {kind: where it registers} in speculators; None: no speculators here
    served: dict[str, str] | None  # {kind: where} vLLM's speculators loader reads; None: no vLLM here
    speculative: dict[str, Any] | None = None  # the --speculative-config vLLM's loader makes of it (method, ...)
    methods: frozenset[str] | None = None  # the speculative method names vLLM accepts
    speculators_version: str | None = None
    vllm_version: str | None = None
    where: dict[str, str] = field(default_factory=dict)
    # what Model Runner V1 refuses of this kind where the host runs it (vLLM's CPU build), None: nothing or not read
    runner_refuses: str | None = None

    @property
    def trains(self) -> bool | None:
        return None if self.trained is None else self.kind in self.trained

    @property
    def method(self) -> str | None:
        return (self.speculative or {}).get("method")

    @property
    def serves(self) -> bool | None:
        if self.served is None:
            return None
        if self.kind not in self.served or self.runner_refuses:
            return False
        if self.methods is None or self.method is None:
            return None
        return self.method in self.methods

    def refusal(self) -> str | None:
        """One line where the pair cannot train or serve this kind; None where it can or cannot be told."""
        if self.trains is False:
            return (f"speculators {self.speculators_version} trains no {self.kind} drafts: its SpeculatorModel "
                    f"registry ({self.where.get('trained', 'speculators/models')}) holds "
                    f"{', '.join(sorted(self.trained or {}))}")
        if self.served is not None and self.kind not in self.served:
            return (f"vLLM {self.vllm_version} cannot serve {self.kind} drafts: its speculators-config loader "
                    f"({self.where.get('served', 'algos.py')}) reads only {', '.join(sorted(self.served))} drafts")
        if self.runner_refuses:
            return (f"vLLM {self.vllm_version} cannot serve {self.kind} drafts on this host: its CPU build runs Model "
                    f"Runner V1, which does not support {self.runner_refuses} "
                    f"({self.where.get('runner', 'vllm/config/vllm.py')})")
        if self.serves is False:
            return (f"vLLM {self.vllm_version} cannot serve {self.kind} drafts: its loader serves it as method "
                    f"{self.method!r}, which its SpeculativeConfig ({self.where.get('methods', 'speculative.py')}) "
                    "does not accept")
        return None


def _decorated(tree: ast.Module, owner: str | None, attr: str) -> dict[str, int]:
    """{name: line} of every `@owner.attr("name")` (owner None: `@attr("name")`) on a class or function."""
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef | ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if not (isinstance(decorator, ast.Call) and decorator.args and isinstance(decorator.args[0], ast.Constant)
                    and isinstance(decorator.args[0].value, str)):
                continue
            func = decorator.func
            named = (isinstance(func, ast.Name) and owner is None and func.id == attr) or (
                isinstance(func, ast.Attribute) and func.attr == attr and isinstance(func.value, ast.Name)
                and func.value.id == owner)
            if named:
                found[decorator.args[0].value] = node.lineno
    return found


def _auto_package(index: ModuleIndex) -> str | None:
    """SpeculatorModel's `auto_package` (the package its registry imports whole), from speculators/model.py."""
    file = index.module_file(SPECULATORS_MODEL)
    tree = index.tree(file) if file is not None else None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.ClassDef) and node.name == "SpeculatorModel":
            for statement in node.body:
                if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                        and statement.target.id == "auto_package" and isinstance(statement.value, ast.Constant)):
                    return str(statement.value.value)
    return None


def trained_kinds(index: ModuleIndex) -> tuple[dict[str, str], str] | None:
    """({kind: file:line}, where) of the kinds speculators' trainer can build; None without speculators."""
    package = _auto_package(index)
    if package is None:
        return None
    folders = index.package_dirs(package)
    kinds: dict[str, str] = {}
    for folder in folders:
        for file in sorted(folder.rglob("*.py")):
            tree = index.tree(file)
            if tree is None:
                continue
            for kind, line in _decorated(tree, "SpeculatorModel", "register").items():
                kinds.setdefault(kind, f"{file.relative_to(folder.parent.parent)}:{line}")
    where = f"{package.replace('.', '/')}/ (SpeculatorModel.auto_package)"
    return kinds, where


def served_kinds(index: ModuleIndex) -> dict[str, str] | None:
    """{kind: file:line} vLLM's speculators-config loader registers; None without that loader."""
    file = index.module_file(ALGOS)
    tree = index.tree(file) if file is not None else None
    if tree is None:
        return None
    where = index.relative_path(ALGOS)
    return {kind: f"{where}:{line}" for kind, line in _decorated(tree, None, "register_speculator").items()}


def speculative_methods(index: ModuleIndex) -> frozenset[str] | None:
    """The speculative method names the installed vLLM's SpeculativeConfig accepts (`SpeculativeMethod`)."""
    file = index.module_file(SPECULATIVE)
    tree = index.tree(file) if file is not None else None
    methods = offered_methods(tree) if tree is not None else None
    return frozenset(methods) if methods is not None else None


def speculative_builder(index: ModuleIndex) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """vLLM's own `build_vllm_speculative_config` (speculators config -> its speculative config), compiled from the
    installed file and run on a plain dict: the method name (and any flag) the loader gives a kind."""
    file = index.module_file(BASE)
    tree = index.tree(file) if file is not None else None
    node = next((node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                 and node.name == "build_vllm_speculative_config"), None) if tree is not None else None
    if node is None:
        return None
    function = _compiled(node, str(file))
    if function is None:
        return None
    return lambda config: function(None, config_dict=config)


def runs_v1_runner(index: ModuleIndex) -> bool:
    """Whether vLLM's CPU worker runs Model Runner V1: its CPUModelRunner subclasses V1's GPUModelRunner."""
    file = index.module_file(CPU_RUNNER)
    tree = index.tree(file) if file is not None else None
    if tree is None:
        return False
    imported = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
                and node.module == V1_RUNNER for alias in node.names}
    return any(isinstance(node, ast.ClassDef) and node.name == "CPUModelRunner"
               and any(isinstance(base, ast.Name) and base.id in imported for base in node.bases) for node in tree.body)


def _strings(node: ast.AST) -> set[str]:
    return {child.value for child in ast.walk(node) if isinstance(child, ast.Constant) and isinstance(child.value, str)}


def v1_refusals(index: ModuleIndex) -> tuple[dict[str, str], dict[str, str]] | None:
    """({speculative method: feature}, {draft architecture: feature}) Model Runner V1 refuses, read from
    VllmConfig._get_v1_model_runner_unsupported_features (vllm/config/vllm.py): an `if` on
    `self.speculative_config.method == "X"` that appends a feature, and an `if self._is_..._draft()` whose helper
    names the draft architectures it matches (0.32: dspark; DFlash2DraftModel, LiLiCorrDraftModel)."""
    file = index.module_file(VLLM_CONFIG)
    tree = index.tree(file) if file is not None else None
    functions = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)} if tree else {}
    gate = functions.get("_get_v1_model_runner_unsupported_features")
    if gate is None:
        return None
    methods: dict[str, str] = {}
    architectures: dict[str, str] = {}
    for node in ast.walk(gate):
        if not isinstance(node, ast.If):
            continue
        appended = [call.args[0].value for call in ast.walk(ast.Module(body=node.body, type_ignores=[]))
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "append" and call.args and isinstance(call.args[0], ast.Constant)
                    and isinstance(call.args[0].value, str)]
        if not appended:
            continue
        test = node.test
        if (isinstance(test, ast.Compare) and isinstance(test.left, ast.Attribute) and test.left.attr == "method"
                and any(isinstance(op, ast.Eq) for op in test.ops)):
            for method in _strings(ast.Tuple(elts=test.comparators, ctx=ast.Load())):
                methods[method] = appended[0]
        elif (isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and test.func.attr in functions
              and test.func.attr.endswith("_draft")):
            helper = functions[test.func.attr]
            for call in ast.walk(helper):  # {"DFlash2DraftModel", ...}.intersection(draft_config.architectures)
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "intersection" and isinstance(call.func.value, ast.Set)):
                    for architecture in _strings(call.func.value):
                        architectures[architecture] = appended[0]
    return methods, architectures


def loader_architectures(index: ModuleIndex, kind: str) -> list[str] | None:
    """The architectures vLLM's loader gives a `kind` draft (its updater run on a minimal config), None: not read."""
    file = index.module_file(ALGOS)
    tree = index.tree(file) if file is not None else None
    node = next((node for node in tree.body if isinstance(node, ast.FunctionDef)
                 and kind in _decorated(ast.Module(body=[node], type_ignores=[]), None, "register_speculator")),
                None) if tree is not None else None
    if node is None or tree is None:
        return None
    # the module's functions together: one updater calls another (update_dflash2 -> update_dflash)
    namespace = _compiled_all([item for item in tree.body if isinstance(item, ast.FunctionDef)], str(file))
    updater = namespace.get(node.name) if namespace is not None else None
    if updater is None:
        return None
    # speculators' default decoder layer: llama for eagle3, qwen3 for every other kind (train/config/schema.py)
    hf: dict[str, Any] = {"model_type": "llama" if kind == "eagle3" else "qwen3"}
    config = {"speculators_model_type": kind, "draft_vocab_size": 1, "aux_hidden_state_layer_ids": [1],
              "mask_token_id": 0, "transformer_layer_config": dict(hf)}
    try:
        updater(config_dict=config, pre_trained_config=hf)
    except (KeyError, ValueError, TypeError, IndexError, NameError):
        return None
    architectures = hf.get("architectures")
    return list(architectures) if isinstance(architectures, list) else None


def _compiled_all(nodes: list[ast.FunctionDef], filename: str) -> dict[str, Any] | None:
    """Pure functions of vLLM's, compiled from its installed source without their decorators, in one namespace
    with a few builtins (nothing else of vLLM's is run)."""
    bare = [ast.FunctionDef(name=node.name, args=node.args, body=node.body, decorator_list=[], returns=None,
                            type_comment=None, type_params=[]) for node in nodes]
    module = ast.fix_missing_locations(ast.Module(body=bare, type_ignores=[]))
    import builtins

    namespace: dict[str, Any] = {"__builtins__": {name: getattr(builtins, name) for name in _BUILTINS}}
    try:
        exec(compile(module, filename, "exec"), namespace)  # vLLM's own loader code, nothing else
    except (SyntaxError, TypeError):
        return None
    return namespace


def _compiled(node: ast.FunctionDef, filename: str) -> Callable[..., Any] | None:
    namespace = _compiled_all([node], filename)
    return namespace[node.name] if namespace is not None else None


def read_kind(kind: str, train_index: ModuleIndex, serve_index: ModuleIndex | None,
              versions: dict[str, str | None], tokens: int = 1, cpu_host: bool = False) -> KindReading:
    """The reading of one kind: trained by the speculators on `train_index`, served by the vLLM on `serve_index`."""
    where: dict[str, str] = {}
    trained = trained_kinds(train_index)
    if trained is not None:
        where["trained"] = trained[1]
    served = served_kinds(serve_index) if serve_index is not None else None
    speculative, methods = None, None
    if served is not None and serve_index is not None:
        where["served"] = serve_index.relative_path(ALGOS)
        methods = speculative_methods(serve_index)
        where["methods"] = f"{serve_index.relative_path(SPECULATIVE)} (SpeculativeMethod)"
        builder = speculative_builder(serve_index)
        if builder is not None and kind in served:
            try:
                speculative = builder({"speculators_model_type": kind, "speculators_config": {
                    "proposal_methods": [{"speculative_tokens": tokens}]}})
            except (KeyError, ValueError, TypeError, IndexError):
                speculative = None
            where["speculative"] = serve_index.relative_path(BASE)
    refuses = None
    if cpu_host and serve_index is not None and served is not None and kind in served and runs_v1_runner(serve_index):
        refusals = v1_refusals(serve_index)
        if refusals is not None:
            method = (speculative or {}).get("method")
            refuses = refusals[0].get(method) if method else None
            for architecture in loader_architectures(serve_index, kind) or []:
                refuses = refuses or refusals[1].get(architecture)
            where["runner"] = f"{serve_index.relative_path(VLLM_CONFIG)}: _get_v1_model_runner_unsupported_features"
    return KindReading(kind, trained[0] if trained is not None else None, served, speculative, methods,
                       versions.get("speculators"), versions.get("vllm"), where, refuses)


def kind_items(reading: KindReading) -> list[Item]:
    """The doctor's lines about the run's kind: trained here, served by the host's vLLM."""
    kind, items = reading.kind, []
    where_trained = reading.where.get("trained", "speculators")
    if reading.trains is None:
        items.append(Item("draft", "unknown", "speculators", f"speculators is not installed here: cannot tell "
                          f"whether it trains a {kind} draft"))
    elif reading.trains:
        items.append(Item("draft", "ok", (reading.trained or {})[kind], f"speculators {reading.speculators_version} "
                          f"trains {kind} drafts (--speculator-type {kind})"))
    else:
        items.append(Item("draft", "error", where_trained, reading.refusal() or "",
                          "set draft.method to one it trains, or install a speculators that trains it"))
    if reading.served is None:
        items.append(Item("draft", "unknown", "vllm", f"no vLLM speculators loader here: cannot tell whether vLLM "
                          f"serves a {kind} draft", "run the doctor with the serve env (--serve-python)"))
    elif reading.serves:
        extra = {key: value for key, value in (reading.speculative or {}).items()
                 if key not in ("method", "num_speculative_tokens")}
        items.append(Item("draft", "ok", reading.served[kind], f"vLLM {reading.vllm_version} serves {kind} drafts "
                          f"as speculative method {reading.method}"
                          + (f" ({', '.join(f'{k}={v}' for k, v in extra.items())})" if extra else "")))
    elif reading.serves is None:
        items.append(Item("draft", "unknown", reading.served.get(kind, reading.where.get("served", "vllm")),
                          f"vLLM {reading.vllm_version}'s loader reads {kind} drafts, but the method it serves them "
                          "under could not be read"))
    else:
        items.append(Item("draft", "error", reading.where.get("served", "vllm"), reading.refusal() or "",
                          "set draft.method to a kind this vLLM serves, or serve with a vLLM that reads it"))
    return items

