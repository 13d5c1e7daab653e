"""Check 1: every call from speculators, and from specops's own pipeline, into vLLM, transformers (and,
for the pipeline, speculators) binds to the installed signature."""

from __future__ import annotations

from pathlib import Path

from specops.analysis import Finding, ModuleIndex, check_calls, check_imports, check_package
from specops.doctor._report import Item

CALLER = "speculators"
CALLEES = {"vllm", "transformers"}
PIPELINE = Path(__file__).resolve().parents[1] / "pipeline"  # this agent's own steps
PIPELINE_CALLEES = {"speculators", "vllm", "transformers"}


def unresolved_fix(finding: Finding, installed: str) -> str:
    """What to do about a call the static check could not judge: it is not known to be wrong."""
    return (f"not known to be wrong: read the call at {Path(finding.file).name}:{finding.line} against {installed} "
            f"by hand, or run the step on a few samples (invoke extract --samples 2)")


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
               f"built for {installed}") if finding.status == "error" else unresolved_fix(finding, installed)
        items.append(Item("api", finding.status, f"{finding.file}:{finding.line}",
                          f"{finding.code} -> {finding.detail}", fix))
    bound = sum(1 for f in findings if f.status == "ok")
    items.append(Item("api", "ok", CALLER, f"{bound} calls and imports into {', '.join(sorted(into))} bind"))
    return items


def check_pipeline_contract(index: ModuleIndex, versions: dict[str, str | None], folder: Path = PIPELINE
                            ) -> list[Item]:
    """specops's pipeline calls into speculators, vLLM and transformers, checked like speculators' own:
    a host whose packages moved under the agent fails here before a run does."""
    into = {name for name in PIPELINE_CALLEES if index.module_file(name) is not None}
    findings: list[Finding] = []
    for file in sorted(folder.rglob("*.py")):
        if index.tree(file) is None:
            findings.append(Finding("import", "unknown", str(file), 1, "", "", "file does not parse"))
            continue
        findings.extend(check_calls(file, index, packages=into))
        findings.extend(f for f in check_imports(file, index) if f.callee.split(".")[0] in into)
    items = []
    for finding in findings:
        if finding.status == "ok":
            continue
        callee_top = finding.callee.split(".")[0] or "?"
        installed = f"{callee_top} {versions.get(callee_top) or '?'}"
        fix = (f"update specops's {Path(finding.file).name} for {installed}"
               if finding.status == "error" else unresolved_fix(finding, installed))
        items.append(Item("api", finding.status, f"{finding.file}:{finding.line}",
                          f"{finding.code} -> {finding.detail}", fix))
    bound = sum(1 for f in findings if f.status == "ok")
    items.append(Item("api", "ok", "specops.pipeline",
                      f"{bound} calls and imports of specops's pipeline into {', '.join(sorted(into)) or 'nothing'} "
                      "bind"))
    return items
