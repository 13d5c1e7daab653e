"""Check 4, from source: what the installed speculators and specops's own steps do with the run's model,
at real lines.

- a model whose tokenizer or config is remote code (`auto_map`) loads only with `trust_remote_code`:
  every `Auto*.from_pretrained(...)` the run's commands reach is read for it — in the speculators
  commands the run launches (the modules each command's module imports, so a command the run never
  runs is not judged: `regenerate-responses` and `generate-offline-data` only on the vllm backend), and
  in specops's own pipeline — and the `speculators train` command line must carry `--trust-remote-code`;
- how the worker reaches the decoder layers of the run's architecture (`_instances.decoder_path_items`).
"""

from __future__ import annotations

import ast
from pathlib import Path

from specops.analysis import ModuleIndex, absolute_module, base_model_class, package_files
from specops.doctor._contract import PIPELINE
from specops.doctor._instances import decoder_path_items
from specops.doctor._report import Item
from specops.doctor.settings import RunSettings

CALLER = "speculators"
# The modules each speculators command the pipeline launches starts in (`speculators NAME`, and
# `python -m speculators.train` under torchrun).
COMMANDS = {
    "train": ("speculators.cli.train", "speculators.train.__main__"),
    "regenerate-responses": ("speculators.cli.regenerate_responses",),
    "generate-offline-data": ("speculators.cli.generate_offline_data",),
}
VLLM_COMMANDS = ("regenerate-responses", "generate-offline-data")  # run against the vllm backend's server
WHAT = {"AutoTokenizer": "the tokenizer", "AutoProcessor": "the processor", "AutoConfig": "the config"}
TRUST_FLAG = "--trust-remote-code"


def run_commands(backend: str | None) -> list[str]:
    return ["train", *(VLLM_COMMANDS if backend == "vllm" else ())]


def reached_files(index: ModuleIndex, commands: list[str]) -> list[Path]:
    """The speculators files the commands' modules import, transitively (parent packages' __init__ left
    out: a sibling command's module is imported, never run); every file of the package when this
    speculators has none of those modules (the in-process generator of 0.3/0.4)."""
    entries = [m for command in commands for m in COMMANDS[command] if index.module_file(m) is not None]
    if not entries:
        return package_files(CALLER, index) if index.module_file(CALLER) is not None else []
    seen: dict[str, Path] = {}
    todo = list(entries)
    while todo:
        module = todo.pop()
        file = index.module_file(module)
        if module in seen or file is None or not file.is_file():
            continue
        seen[module] = file
        tree = index.tree(file)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Import):
                todo.extend(alias.name for alias in node.names if alias.name.split(".")[0] == CALLER)
            elif isinstance(node, ast.ImportFrom):
                base = absolute_module(module, index.is_package(module), node.level, node.module)
                if base and base.split(".")[0] == CALLER:
                    todo.extend([base, *(f"{base}.{alias.name}" for alias in node.names)])
    return sorted(seen.values())


def remote_loads(index: ModuleIndex, files: list[Path]) -> list[tuple[str, int, str, bool]]:
    """(file, line, Auto class, passes trust_remote_code) for each `Auto*.from_pretrained(...)` in files. A
    call passes it when it names the keyword (a literal False does not count) or forwards **kwargs."""
    found = []
    for file in files:
        if "from_pretrained" not in (index.text(file) or ""):
            continue
        tree = index.tree(file)
        for node in ast.walk(tree) if tree is not None else ():
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "from_pretrained"):
                continue
            owner = ast.unparse(node.func.value).rsplit(".", 1)[-1]
            if not owner.startswith("Auto"):
                continue
            passes = any(k.arg is None or (k.arg == "trust_remote_code" and not (
                isinstance(k.value, ast.Constant) and k.value.value is False)) for k in node.keywords)
            found.append((str(file), node.lineno, owner, passes))
    return sorted(found)


def needing_trust(index: ModuleIndex, facts: dict) -> set[str]:
    """The Auto classes that load this model only with trust_remote_code: the tokenizer's (and the
    processor's, which loads it) when the tokenizer is remote code; the config's and models' when
    config.json maps them to its own code and transformers has no class of its own for the model_type
    (with one, transformers loads its own class and never asks)."""
    needing = {"AutoTokenizer", "AutoProcessor"} if facts.get("remote_tokenizer") else set()
    own = facts.get("remote_config") or []
    model_type = facts.get("outer_model_type")
    if own and not (isinstance(model_type, str) and base_model_class(model_type, index)):
        needing.update(own)
        needing.update({"AutoConfig", "AutoModel", "AutoModelForCausalLM"})
    return needing


def trust_items(index: ModuleIndex, versions: dict[str, str | None], facts: dict,
                settings: RunSettings, pipeline: Path = PIPELINE) -> list[Item]:
    """Every loader the run's commands reach passes trust_remote_code, when the model needs it."""
    needing = needing_trust(index, facts)
    if not (needing and settings.trust_remote_code):
        return []  # a plain model loads either way; an untrusted remote one is _model's error already
    version = versions.get(CALLER)
    commands = run_commands(settings.backend)
    theirs = remote_loads(index, reached_files(index, commands)) if index.module_file(CALLER) is not None else []
    ours = remote_loads(index, sorted(pipeline.rglob("*.py")))
    items = []
    theirs = [load for load in theirs if load[2] in needing]
    ours = [load for load in ours if load[2] in needing]
    for file, line, owner, passes in theirs + ours:
        if passes:
            continue
        mine = file.startswith(str(pipeline))
        items.append(Item("model", "error", f"{file}:{line}",
                          f"{'specops' if mine else f'speculators {version}'} loads {WHAT.get(owner, 'the model')} "
                          f"without trust_remote_code ({Path(file).name}:{line}: {owner}.from_pretrained); "
                          + ("this model's tokenizer is remote code (tokenizer_config.json auto_map)"
                             if owner in ("AutoTokenizer", "AutoProcessor") else
                             "this model's classes are remote code (config.json auto_map)"),
                          "pass trust_remote_code=run.config.trust_remote_code" if mine else
                          "patch the call to pass trust_remote_code=True or use a speculators release that passes it"))
    if not items:
        items.append(Item("model", "ok", CALLER, f"every loader the run reaches passes trust_remote_code: "
                          f"{len(theirs)} in speculators {version} ({', '.join(commands)}), {len(ours)} in specops's "
                          "pipeline"))
    return items


def command_flag_items(index: ModuleIndex, facts: dict, settings: RunSettings) -> list[Item]:
    """The command lines the run launches carry --trust-remote-code when the model needs it: speculators
    train's loaders (AutoConfig, AutoProcessor) and vLLM's tokenizer and config take trust_remote_code from
    it (not cached: they are the run's command lines, not the installed files)."""
    if not (settings.trust_remote_code and needing_trust(index, facts)):
        return []
    items = []
    for command, flags in (("speculators train", settings.train_flags), ("vllm serve", settings.serve_flags)):
        if not flags:
            continue  # the run launches no such command (or it could not be built yet)
        if TRUST_FLAG in flags:
            items.append(Item("model", "ok", command, f"the run's {command} command passes {TRUST_FLAG}"))
        else:
            items.append(Item("model", "error", command, f"the run's {command} command has no {TRUST_FLAG}: its "
                              "loaders take trust_remote_code from it, and this model is remote code (auto_map)",
                              f"build the {command} command with {TRUST_FLAG} when the run trusts remote code"))
    return items


def model_rule_items(index: ModuleIndex, versions: dict[str, str | None], facts: dict,
                     settings: RunSettings) -> list[Item]:
    return (trust_items(index, versions, facts, settings)
            + decoder_path_items(index, facts.get("architecture")))
