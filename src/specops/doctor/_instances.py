"""Check 1, on instances: speculators' calls through `self.scheduler`/`self.executor`, and the function
its worker attaches to the model (`types.MethodType`), bound per target architecture.

For a run, the architecture is the model's (config.json `architectures`); without one, each of the
common decoder families in the installed vLLM's registry, reported per architecture.
"""

from __future__ import annotations

from pathlib import Path

from specops.analysis import (
    Finding,
    ModuleIndex,
    check_assigned_functions,
    check_bound_functions,
    check_instance_calls,
    common_architectures,
    files_binding_methods,
    package_files,
)
from specops.doctor._report import Item

CALLER = "speculators"
CALLEES = {"vllm"}


def architectures_for(index: ModuleIndex, architecture: str | None) -> list[str]:
    return [architecture] if architecture else common_architectures(index)


def instance_findings(index: ModuleIndex, architecture: str | None) -> tuple[list[Finding], list[Finding]]:
    """(calls through self.x, uses inside bound functions), computed once per index and architecture."""
    key = ("instance_findings", architecture)
    cache = index.__dict__.setdefault("_doctor_cache", {})
    if key not in cache:
        files = package_files(CALLER, index) if index.module_file(CALLER) is not None else []
        calls: list[Finding] = []
        for file in files:
            if index.tree(file) is not None and "vllm" in (index.text(file) or ""):
                calls.extend(check_instance_calls(file, index, packages=CALLEES))
                calls.extend(f for f in check_assigned_functions(file, index) if "vllm." in f.callee)
        bound: list[Finding] = []
        for file in files_binding_methods(files, index):
            if index.tree(file) is not None:
                bound.extend(check_bound_functions(file, index, architectures_for(index, architecture)))
        cache[key] = (calls, bound)
    return cache[key]


def _grouped(findings: list[Finding]) -> list[tuple[Finding, list[str]]]:
    """One entry per (file, line, status, callee name): the architectures it holds for, listed."""
    groups: dict[tuple, tuple[Finding, list[str]]] = {}
    for finding in findings:
        arch = finding.detail.partition("] ")[0] if finding.detail.startswith("[") else ""
        key = (finding.file, finding.line, finding.status, finding.callee.rsplit(".", 1)[-1])
        if key not in groups:
            groups[key] = (finding, [])
        if arch:
            groups[key][1].append(arch.lstrip("["))
    return list(groups.values())


def check_instances(index: ModuleIndex, versions: dict[str, str | None], architecture: str | None) -> list[Item]:
    if index.module_file(CALLER) is None or index.module_file("vllm") is None:
        return []
    calls, bound = instance_findings(index, architecture)
    items: list[Item] = []
    installed = f"vllm {versions.get('vllm') or '?'}"
    for finding, architectures in _grouped(calls + bound):
        if finding.status == "ok":
            continue
        why = finding.detail
        if architectures:
            why = f"for {', '.join(architectures)}: {why.partition('] ')[2]}"
        fix = (f"patch speculators {versions.get(CALLER)} for {installed}, or install a speculators release built "
               f"for {installed}") if finding.status == "error" else ""
        items.append(Item("api", finding.status, f"{finding.file}:{finding.line}", f"{finding.code} -> {why}", fix))
    bound_ok = sum(1 for f in calls + bound if f.status == "ok")
    families = ", ".join(architectures_for(index, architecture)) or "no architecture"
    items.append(Item("api", "ok", CALLER, f"{bound_ok} calls and attributes on vLLM instances bind (model hooks "
                                           f"checked for {families})"))
    return items


def decoder_path_items(index: ModuleIndex, architecture: str | None) -> list[Item]:
    """How the worker reaches the decoder layers of the run's model, read from the installed code."""
    if not architecture or index.module_file(CALLER) is None or index.module_file("vllm") is None:
        return []
    _, bound = instance_findings(index, architecture)
    wrong = [f for f in bound if f.kind == "attribute" and f.status == "error" and " keeps it at " in f.detail]
    items = []
    for finding in wrong:
        kept = finding.detail.split(" keeps it at ", 1)[1].split(" (", 1)[0]
        items.append(Item("model", "warn", f"{finding.file}:{finding.line}",
                          f"speculators' worker reaches the decoder as {finding.code} ({Path(finding.file).name}:"
                          f"{finding.line}); {architecture} keeps it at model.{kept}",
                          "patch the worker to reach the wrapped language model, or use a speculators release "
                          "that does (get_language_model())"))
    if not wrong and any(f.status == "ok" for f in bound):
        items.append(Item("model", "ok", architecture, "speculators' worker reaches this architecture's decoder "
                                                       "layers (read from the installed worker and vLLM model)"))
    return items
