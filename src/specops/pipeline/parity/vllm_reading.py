"""How the installed vLLM reads an EAGLE-3 draft's config.json, taken from its own source; vLLM is never imported.

vLLM's speculators loader (vllm/transformers_utils/configs/speculators/) turns the draft's config.json into
the draft's hf config: `update_eagle3(config_dict, pre_trained_config)` copies the keys it knows, with its own
defaults (0.32: norm_before_residual True where speculators' field default is False). `build_vllm_speculative_config`
names the method the draft's type serves as. The worker then takes the auxiliary layer ids from that config
(or, without them, the target's default `(2, n // 2, n - 3)`) and keeps them as `tuple(sorted(set(ids)))`.

The two loader functions are pure dict code: they are compiled from the installed files and run on the
config dict with a few builtins, so the reading is the installed vLLM's own, whatever its version.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ALGOS = "vllm.transformers_utils.configs.speculators.algos"
BASE = "vllm.transformers_utils.configs.speculators.base"
INTERFACES = "vllm.model_executor.models.interfaces"
# What the loader functions may use: they build dicts and raise on what they do not support.
_ALLOWED = ("ValueError", "KeyError", "TypeError", "IndexError", "NotImplementedError", "isinstance", "list",
            "dict", "tuple", "set", "len", "sorted", "str", "int", "float", "bool", "getattr", "any", "all", "range")


def _builtins() -> dict[str, Any]:
    import builtins

    return {name: getattr(builtins, name) for name in _ALLOWED}


@dataclass
class VllmReading:
    """The installed vLLM's reading of a speculators draft config."""

    version: str | None
    search_path: list[str]
    types: set[str]  # speculators_model_type values the loader registers
    updaters: dict[str, Callable[..., None]] = field(default_factory=dict)
    method_of: Callable[..., dict[str, Any]] | None = None
    sorts_aux_layers: bool = False
    default_aux: Callable[[int], tuple[int, ...]] | None = None
    aux_count: int | None = None  # the only auxiliary-state count its EAGLE-3 draft takes (<= 0.16: 3); None: any
    where: dict[str, str] = field(default_factory=dict)  # what was read, for the report

    def draft_hf_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The draft's hf config as vLLM builds it (ValueError when vLLM would refuse the draft)."""
        kind = config.get("speculators_model_type")
        if kind not in self.updaters:
            raise ValueError(f"vLLM's speculators loader has no type {kind!r} (it has {sorted(self.types)})")
        hf = dict(config.get("transformer_layer_config") or {})
        self.updaters[kind](config_dict=config, pre_trained_config=hf)
        return hf

    def method(self, config: dict[str, Any]) -> str | None:
        if self.method_of is None:
            return config.get("speculators_model_type")
        return self.method_of(None, config).get("method")

    def aux_layers(self, hf: dict[str, Any], target_layers: int) -> tuple[list[int] | None, str]:
        """The auxiliary layer ids the target captures when serving, in the order vLLM concatenates them."""
        ids = hf.get("eagle_aux_hidden_state_layer_ids")
        origin = "the draft config"
        if not ids:
            if self.default_aux is None:
                return None, "the target's default (not readable from this vLLM)"
            ids, origin = list(self.default_aux(target_layers)), "the target's default: none in the draft config"
        ids = list(ids)
        if self.sorts_aux_layers:
            ids = sorted(set(ids))
        return ids, origin


def vllm_search_path(serve_python: str | None = None) -> list[str] | None:
    """Where the vLLM that will serve is installed: the serve env's path, else this interpreter's; None without."""
    from specops.doctor import chosen_serve_python, vllm_path

    return vllm_path(chosen_serve_python(serve_python))


def _version(search_path: list[str]) -> str | None:
    from specops.doctor import vllm_version

    return vllm_version(search_path)


def _compiled(node: ast.FunctionDef, filename: str) -> Callable[..., Any]:
    node = ast.FunctionDef(name=node.name, args=node.args, body=node.body, decorator_list=[],
                           returns=None, type_comment=None, type_params=[])
    module = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
    namespace: dict[str, Any] = {"__builtins__": _builtins()}
    exec(compile(module, filename, "exec"), namespace)  # vLLM's own loader code, nothing else
    return namespace[node.name]


def _registered(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                if (isinstance(decorator, ast.Call) and decorator.args and isinstance(decorator.args[0], ast.Constant)
                        and isinstance(decorator.args[0].value, str)):
                    found[decorator.args[0].value] = node
    return found


def _method(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _default_aux(node: ast.FunctionDef | None) -> Callable[[int], tuple[int, ...]] | None:
    """The default's last `return` expression, evaluated with `num_layers` bound (e.g. (2, n // 2, n - 3))."""
    if node is None or not node.body or not isinstance(node.body[-1], ast.Return) or node.body[-1].value is None:
        return None
    code = compile(ast.Expression(node.body[-1].value), "<default aux layers>", "eval")

    def default(num_layers: int) -> tuple[int, ...]:
        return tuple(eval(code, {"__builtins__": {}}, {"num_layers": num_layers}))

    return default


def read_vllm(serve_python: str | None = None, search_path: list[str] | None = None) -> VllmReading | None:
    """The installed vLLM's reading, or None where no vLLM is installed (a CPU host of the hf backend).
    `search_path`: where it is installed (the run's settings' vllm_path), else found from `serve_python`."""
    from specops.analysis import ModuleIndex

    search_path = search_path or vllm_search_path(serve_python)
    if search_path is None:
        return None
    index = ModuleIndex(search_path)
    reading = VllmReading(version=_version(search_path), search_path=search_path, types=set())
    algos_file = index.module_file(ALGOS)
    algos = index.tree(algos_file) if algos_file is not None else None
    if algos is not None:
        registered = _registered(algos)
        reading.types = set(registered)
        for kind, node in registered.items():
            try:
                reading.updaters[kind] = _compiled(node, str(algos_file))
            except (SyntaxError, KeyError, TypeError):
                continue
        reading.where["loader"] = index.relative_path(ALGOS)
    base_file = index.module_file(BASE)
    base = index.tree(base_file) if base_file is not None else None
    builder = _method(base, "build_vllm_speculative_config") if base is not None else None
    if builder is not None:
        reading.method_of = _compiled(builder, str(base_file))
        reading.where["method"] = index.relative_path(BASE)
    from specops.doctor import aux_rule

    rule = aux_rule(index)  # the doctor's rule, read the same way: how many auxiliary states the draft's fc takes
    if rule is not None:
        reading.aux_count = rule.fixed
        reading.where["aux count"] = rule.where
    interfaces_file = index.module_file(INTERFACES)
    interfaces = index.tree(interfaces_file) if interfaces_file is not None else None
    if interfaces is not None:
        reading.default_aux = _default_aux(_method(interfaces, "get_eagle3_default_aux_hidden_state_layers"))
        setters = [node for node in ast.walk(interfaces) if isinstance(node, ast.FunctionDef)
                   and node.name in ("_set_aux_hidden_state_layers", "set_aux_hidden_state_layers")]
        reading.sorts_aux_layers = any(isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                                       and call.func.id == "sorted" for node in setters for call in ast.walk(node))
        reading.where["aux layers"] = index.relative_path(INTERFACES)
    return reading
