"""Check 1: every call from speculators into vLLM and transformers binds to the installed signature."""

from __future__ import annotations

from specops.analysis import ModuleIndex, check_package
from specops.doctor._report import Item

CALLER = "speculators"
CALLEES = {"vllm", "transformers"}


def check_api_contract(index: ModuleIndex, versions: dict[str, str | None]) -> list[Item]:
    if index.module_file(CALLER) is None:
        return [Item("api", "error", CALLER, "speculators is not installed", "install speculators")]
    into = {name for name in CALLEES if index.module_file(name) is not None}
    findings = check_package(CALLER, index, into=into)
    items = []
    for finding in findings:
        if finding.status == "ok":
            continue
        callee_top = finding.callee.split(".")[0] or "?"
        installed = f"{callee_top} {versions.get(callee_top) or '?'}"
        fix = (f"patch speculators {versions.get(CALLER)} for {installed}, or install a speculators release "
               f"built for {installed}") if finding.status == "error" else ""
        items.append(Item("api", finding.status, f"{finding.file}:{finding.line}",
                          f"{finding.code} -> {finding.detail}", fix))
    bound = sum(1 for f in findings if f.status == "ok")
    items.append(Item("api", "ok", CALLER, f"{bound} calls and imports into {', '.join(sorted(into))} bind"))
    return items
