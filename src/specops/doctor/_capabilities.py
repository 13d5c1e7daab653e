"""Check 3: what the run needs from the installed vLLM, probed from its source (FACTS.md versions)."""

from __future__ import annotations

import ast

from specops.analysis import DefTarget, ModuleIndex, Unresolved, package_files
from specops.doctor._report import Item, at_least

REGISTRY = "vllm.model_executor.models.registry"
DEEPSEEK_FAMILY = ("Deepseek", "Kimi")
# the packages that name what they need from the vLLM server (a speculative method, a KV connector) in their code
NAMERS = ("speculators", "hs_connectors")


def server_pipeline(versions: dict[str, str | None]) -> bool:
    """speculators ≥0.5 extracts through a vLLM server; older ones run vLLM in process."""
    return at_least(versions.get("speculators"), "0.5")


def _source_mentions(index: ModuleIndex, module: str, text: str) -> bool | None:
    file = index.module_file(module)
    if file is None:
        return None
    source = index.text(file) if file.is_file() else None
    return source is not None and text in source


def architecture_class(index: ModuleIndex, architecture: str) -> tuple[str, str] | None:
    """(module, class) vLLM's model registry maps an HF architecture name to, read from its dict literals."""
    file = index.module_file(REGISTRY)
    tree = index.tree(file) if file is not None else None
    if tree is None:
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if (isinstance(key, ast.Constant) and key.value == architecture and isinstance(value, ast.Tuple)
                    and len(value.elts) == 2 and all(isinstance(e, ast.Constant) for e in value.elts)):
                return value.elts[0].value, value.elts[1].value  # type: ignore[attr-defined]
    return None


def named_at(index: ModuleIndex, text: str) -> str | None:
    """file:line of the first string constant equal to `text` in the installed speculators or hs_connectors: the
    caller's line that asks the server for it (a connector name in a kv_transfer_config, a method compared)."""
    for package in NAMERS:
        if index.module_file(package) is None:
            continue
        for file in package_files(package, index):
            source = index.text(file)
            if source is None or text not in source:
                continue
            tree = index.tree(file)
            lines = sorted(node.lineno for node in ast.walk(tree) if isinstance(node, ast.Constant)
                           and node.value == text) if tree is not None else []
            if lines:
                return f"{file}:{lines[0]}"
    return None


def implements(index: ModuleIndex, qualname: str, interface: str) -> bool | None:
    target = index.resolve(qualname)
    if not isinstance(target, DefTarget) or not target.is_class:
        return None
    unresolved = False
    for klass in index.mro(target):
        if isinstance(klass, Unresolved):
            if klass.qualname.endswith(f".{interface}"):
                return True
            # a base from outside the interface's package (torch.nn.Module) cannot be the interface
            unresolved = unresolved or klass.qualname.split(".")[0] == qualname.split(".")[0]
        elif klass.node.name == interface:
            return True
    return None if unresolved else False


# Where vLLM goes: its own env (its pins conflict with the training env's), named in the inventory.
INSTALL_VLLM = ("its own env, e.g. scripts/setup-vllm.sh here; name that env's python as the host's envs.serve "
                "in inventory.yaml")


def check_capabilities(index: ModuleIndex, versions: dict[str, str | None], architecture: str | None,
                       serve_flags: list[str], prepare_flags: list[str], required: bool = True) -> list[Item]:
    """`required`: a run on the vllm backend needs vLLM; the installed stack alone may do without it."""
    vllm = versions.get("vllm")
    if vllm is None:
        if not required:
            return [Item("capability", "warn", "vllm", "vLLM is not installed: only the hf backend can run",
                         f"install vLLM for the vllm backend ({INSTALL_VLLM})")]
        return [Item("capability", "error", "vllm", "vLLM is not installed", f"install vLLM ({INSTALL_VLLM})")]
    items: list[Item] = []
    server = server_pipeline(versions)
    for needed, module, minimum in (("extract_hidden_states", "vllm.config.speculative", "0.17"),
                                    ("ExampleHiddenStatesConnector",
                                     "vllm.distributed.kv_transfer.kv_connector.factory", "0.17")):
        present = _source_mentions(index, module, needed)
        where = f"{index.relative_path(module)}"
        if present:
            items.append(Item("capability", "ok", where, f"vLLM {vllm} has {needed}"))
        elif not server:
            items.append(Item("capability", "ok", where, f"vLLM {vllm} lacks {needed} (needs ≥{minimum}); "
                              f"not used by speculators {versions.get('speculators')}'s in-process extraction"))
        else:
            caller = named_at(index, needed)
            asked = f" ({caller} names it)" if caller else ""
            items.append(Item("capability", "error", where, f"vLLM {vllm} lacks {needed}; it needs vLLM ≥{minimum}"
                              f"{asked}", f"install vLLM ≥{minimum}"))
    if architecture:
        items.extend(_architecture(index, vllm, architecture))
    if server and (at_least(vllm, "0.30") or _source_mentions(index, "vllm.engine.arg_utils", "enable_scale_out")):
        uses_render = any(flag.startswith("--render-endpoint") for flag in prepare_flags)
        has_flag = any(flag.split("=")[0] in ("--enable-scale-out", "--enable_scale_out") for flag in serve_flags)
        if uses_render and not has_flag:
            items.append(Item("capability", "error", "vllm serve", f"vLLM {vllm} serves /render only with "
                              "--enable-scale-out, and prepare-data uses --render-endpoint",
                              "add --enable-scale-out to the serve flags"))
        else:
            items.append(Item("capability", "ok", "vllm serve", "/render endpoint reachable with these flags"))
    return items


def _architecture(index: ModuleIndex, vllm: str, architecture: str) -> list[Item]:
    mapped = architecture_class(index, architecture)
    if mapped is None:
        return [Item("capability", "error", architecture, f"vLLM {vllm}'s model registry has no {architecture}",
                     "install a vLLM that supports this architecture")]
    module, cls = mapped
    qualname = f"vllm.model_executor.models.{module}.{cls}"
    where = f"{index.relative_path(f'vllm.model_executor.models.{module}')} ({cls})"
    supports = implements(index, qualname, "SupportsEagle3")
    deepseek = architecture.startswith(DEEPSEEK_FAMILY)
    items = []
    if supports is True:
        items.append(Item("capability", "ok", where, f"{cls} implements SupportsEagle3"))
    elif supports is False:
        needs = " (DeepSeek/Kimi gain it in vLLM 0.18)" if deepseek else ""
        items.append(Item("capability", "error", where, f"{cls} does not implement SupportsEagle3 in vLLM "
                          f"{vllm}{needs}: hidden states cannot be captured and the draft cannot be served",
                          "install vLLM ≥0.18" if deepseek else "use a target vLLM supports for EAGLE-3"))
    else:
        items.append(Item("capability", "unknown", where, f"could not follow {cls}'s base classes",
                          f"check by hand that {cls} in {where} implements SupportsEagle3"))
    if deepseek and not at_least(vllm, "0.25"):
        items.append(Item("capability", "warn", where, f"vLLM {vllm} does not capture the final layer for "
                          f"{architecture} (vLLM #48124, fixed in 0.25)", "install vLLM ≥0.25 or leave the "
                          "final layer out of layer_ids"))
    else:
        items.append(Item("capability", "ok", where, "final layer can be captured"))
    return items
