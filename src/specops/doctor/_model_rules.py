"""Check 4, from source: what the installed speculators does with the run's model, at real lines.

- a tokenizer that is remote code (`auto_map`) loads only with `trust_remote_code=True`: every
  `AutoTokenizer.from_pretrained(...)` in the installed package is read for it;
- how the worker reaches the decoder layers of the run's architecture (`_instances.decoder_path_items`).
"""

from __future__ import annotations

import ast

from specops.analysis import ModuleIndex, package_files
from specops.doctor._instances import decoder_path_items
from specops.doctor._report import Item

CALLER = "speculators"
LOADERS = ("AutoTokenizer.from_pretrained",)


def tokenizer_loads(index: ModuleIndex) -> list[tuple[str, int, bool]]:
    """(file, line, passes trust_remote_code) for every tokenizer load in the installed package."""
    found = []
    for file in package_files(CALLER, index) if index.module_file(CALLER) is not None else []:
        text = index.text(file) or ""
        if "AutoTokenizer" not in text:
            continue
        tree = index.tree(file)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(LOADERS):
                passes = any(k.arg == "trust_remote_code" or k.arg is None for k in node.keywords)
                found.append((str(file), node.lineno, passes))
    return sorted(found)


def tokenizer_items(index: ModuleIndex, versions: dict[str, str | None], remote: bool, trusted: bool) -> list[Item]:
    if not (remote and trusted):
        return []  # a plain tokenizer loads either way; an untrusted remote one is _model's error already
    loads = tokenizer_loads(index)
    version = versions.get(CALLER)
    missing = [(file, line) for file, line, passes in loads if not passes]
    items = [Item("model", "error", f"{file}:{line}", f"speculators {version} loads the tokenizer without "
                  f"trust_remote_code ({file.rsplit('/', 1)[-1]}:{line}); this tokenizer is remote code (auto_map)",
                  "patch the call to pass trust_remote_code=True or use a speculators release that passes it")
             for file, line in missing]
    if loads and not missing:
        items.append(Item("model", "ok", CALLER, f"speculators {version} passes trust_remote_code at each of its "
                                                 f"{len(loads)} tokenizer load(s)"))
    return items


def model_rule_items(index: ModuleIndex, versions: dict[str, str | None], facts: dict, trusted: bool) -> list[Item]:
    return (tokenizer_items(index, versions, bool(facts.get("remote_tokenizer")), trusted)
            + decoder_path_items(index, facts.get("architecture")))
