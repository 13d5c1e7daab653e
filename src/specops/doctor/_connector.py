"""The run's hidden-states backend (`hidden_states.backend`: file, fp8, mooncake) against the serve env: the
connector that backend's server loads must be there before any load.

Which connector a backend loads is read from hs_connectors' own transfer.py, not listed here: the class registered
as `@HiddenStatesBackend.register("<name>")` builds the server's kv_transfer_config in its
`build_kv_transfer_config`, a dict literal naming `kv_connector` and, out of tree, `kv_connector_module_path`.
That module must exist in the serve env and define the class; what it imports from vLLM (fp8's connector subclasses
vLLM's ExampleHiddenStatesConnector) must be in the installed vLLM; mooncake's store needs `mooncake.store`
(PyPI mooncake-transfer-engine). Standard library only; nothing is imported.
"""

from __future__ import annotations

import ast

from specops.analysis import ModuleIndex
from specops.doctor._report import Item

TRANSFER = "hs_connectors.transfer"
IN_TREE = "vllm.distributed.kv_transfer.kv_connector.factory"  # vLLM's own connectors register there
STORE_MODULES = {"mooncake": ("mooncake.store", "mooncake-transfer-engine")}


def backend_connector(index: ModuleIndex, backend: str) -> tuple[str, str | None] | None:
    """(kv_connector, kv_connector_module_path or None) hs_connectors' backend `backend` asks the server for;
    None when transfer.py is absent or does not say."""
    file = index.module_file(TRANSFER)
    tree = index.tree(file) if file is not None else None
    if tree is None:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and _registered_as(node) == backend:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "build_kv_transfer_config":
                    return _connector_of(item)
    return None


def _registered_as(node: ast.ClassDef) -> str | None:
    for decorator in node.decorator_list:
        if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                and decorator.func.attr == "register" and decorator.args
                and isinstance(decorator.args[0], ast.Constant)):
            return decorator.args[0].value
    return None


def _connector_of(function: ast.FunctionDef) -> tuple[str, str | None] | None:
    for node in ast.walk(function):
        if isinstance(node, ast.Dict):
            values = {key.value: value for key, value in zip(node.keys, node.values, strict=True)
                      if isinstance(key, ast.Constant)}
            connector = values.get("kv_connector")
            if isinstance(connector, ast.Constant):
                module = values.get("kv_connector_module_path")
                return connector.value, _text(module)
    return None


def _text(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _defines(index: ModuleIndex, module: str, name: str) -> bool | None:
    file = index.module_file(module)
    tree = index.tree(file) if file is not None else None
    if tree is None:
        return None
    return any(isinstance(node, ast.ClassDef) and node.name == name for node in tree.body)


def _vllm_imports(index: ModuleIndex, module: str) -> list[str]:
    """The vllm modules `module` imports (from x import y: x.y when that is a module, else x)."""
    file = index.module_file(module)
    tree = index.tree(file) if file is not None else None
    found = []
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm"):
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                found.append(dotted if index.module_file(dotted) is not None else node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("vllm")]
    return found


def connector_items(serving: ModuleIndex, backend: str, vllm: str | None) -> list[Item]:
    """ok / error / unknown for the run's backend's connector in the serve env (`serving`)."""
    if backend == "file" or vllm is None:
        return []  # file: vLLM's own connector, judged by the capability check; no vLLM: said there
    where = serving.relative_path(TRANSFER)
    named = backend_connector(serving, backend)
    if named is None:
        return [Item("capability", "error" if serving.module_file(TRANSFER) is None else "unknown", where,
                     f"hidden_states.backend {backend}: hs_connectors' {TRANSFER} is not in the serve env or does "
                     f"not say which connector backend {backend!r} loads",
                     "install hs-connectors (speculators' dependency) in the serve env")]
    connector, module = named
    items = []
    if module is None:
        present = serving.module_file(IN_TREE) is not None and connector in (
            serving.text(serving.module_file(IN_TREE)) or "")
        items.append(Item("capability", "ok" if present else "error", serving.relative_path(IN_TREE),
                          f"vLLM {vllm} {'registers' if present else 'lacks'} {connector} "
                          f"(hidden_states.backend {backend})", "" if present else "install a vLLM that has it"))
        return items
    defined = _defines(serving, module, connector)
    if not defined:
        return [Item("capability", "error", module, f"hidden_states.backend {backend} loads {connector} from {module}, "
                     f"which the serve env {'lacks' if defined is None else 'has without that class'}",
                     "install hs-connectors in the serve env (pip install hs-connectors)")]
    missing = [name for name in _vllm_imports(serving, module) if serving.module_file(name) is None]
    if missing:
        items.append(Item("capability", "error", serving.relative_path(module),
                          f"{connector} (hidden_states.backend {backend}) imports {missing[0]}, which vLLM {vllm} "
                          "lacks: the server would fail to load it", "install a vLLM that has it (≥0.17)"))
    else:
        items.append(Item("capability", "ok", serving.relative_path(module),
                          f"{connector} for hidden_states.backend {backend} is in the serve env, and what it imports "
                          f"from vLLM {vllm} is there"))
    store = STORE_MODULES.get(backend)
    if store and serving.module_file(store[0]) is None:
        items.append(Item("capability", "error", store[0], f"hidden_states.backend {backend} needs {store[0]}, "
                          "which the serve env lacks", f"pip install {store[1]}"))
    return items
