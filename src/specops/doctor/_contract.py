"""Check 1: every call from speculators, from hs_connectors (speculators ≥ 0.8's hidden-states transport,
which runs inside vLLM's server as its KV connector), and from specops's own pipeline, into vLLM,
transformers (and, for the pipeline, speculators) binds to the installed signature."""

from __future__ import annotations

import ast
from pathlib import Path

from specops.analysis import Finding, ModuleIndex, check_calls, check_imports, check_package, package_files
from specops.doctor._report import Item

CALLER = "speculators"
# packages whose own code calls into vLLM: speculators always (it is what the doctor judges), hs_connectors where
# installed (hs-connectors, a dependency of speculators ≥ 0.8, imports ~18 vLLM names; its connectors are
# loaded by the vLLM server, so a name the installed vLLM lacks fails the server's start)
CALLERS = (CALLER, "hs_connectors")
CALLEES = {"vllm", "transformers"}
PIPELINE = Path(__file__).resolve().parents[1] / "pipeline"  # this agent's own steps
PIPELINE_CALLEES = {"speculators", "vllm", "transformers"}


def unresolved_fix(finding: Finding, installed: str) -> str:
    """What to do about a call the static check could not judge: it is not known to be wrong."""
    return (f"not known to be wrong: read the call at {Path(finding.file).name}:{finding.line} against {installed} "
            f"by hand, or run the step on a few samples (invoke extract --samples 2)")


def check_api_contract(index: ModuleIndex, versions: dict[str, str | None],
                       callers: tuple[str, ...] = CALLERS) -> list[Item]:
    """`callers`: (CALLER,) where hs_connectors is judged in the serve env instead (check_connector_contract)."""
    if index.module_file(CALLER) is None:
        return [Item("api", "error", CALLER, "speculators is not installed", "install speculators")]
    into = {name for name in CALLEES if index.module_file(name) is not None}
    items: list[Item] = []
    for caller in callers:
        if caller != CALLER and (index.module_file(caller) is None or not required_by(index, CALLER, caller)):
            continue  # an optional caller not installed, or not the judged speculators' own dependency
        items.extend(_caller_items(caller, index, versions, into))
    return items


def connector_modules(index: ModuleIndex, package: str) -> dict[str, str]:
    """{file: "loaded by vLLM only for <Class>'s KV connector (file:line)"} for the modules a package hands vLLM's
    server by name (`"kv_connector_module_path": "pkg.module"` in a kv_transfer_config it builds): what is wrong in
    such a module breaks the server only when a run picks that backend."""
    found: dict[str, str] = {}
    for file in package_files(package, index):
        source = index.text(file)
        if source is None or "kv_connector_module_path" not in source:
            continue
        tree = index.tree(file)
        for klass in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)) if tree else []:
            for node in ast.walk(klass):
                if not isinstance(node, ast.Dict):
                    continue
                for key, value in zip(node.keys, node.values, strict=True):
                    if (isinstance(key, ast.Constant) and key.value == "kv_connector_module_path"
                            and isinstance(value, ast.Constant) and isinstance(value.value, str)):
                        module = index.module_file(value.value)
                        if module is not None:
                            found[str(module)] = (f"vLLM loads this module only for {klass.name}'s KV connector "
                                                  f"({file}:{key.lineno}); other backends do not import it")
    return found


def check_connector_contract(serving: ModuleIndex, versions: dict[str, str | None]) -> list[Item]:
    """hs_connectors judged where vLLM's server loads it: the serve env, when it is not the run's own env."""
    if serving.module_file("hs_connectors") is None:
        return []
    into = {name for name in CALLEES if serving.module_file(name) is not None}
    return _caller_items("hs_connectors", serving, versions, into)


def _caller_items(caller: str, index: ModuleIndex, versions: dict[str, str | None], into: set[str]) -> list[Item]:
    findings = check_package(caller, index, into=into)
    release = versions.get(caller) or _installed_version(index, caller)
    scoped = connector_modules(index, caller) if caller != CALLER else {}
    items = []
    for finding in findings:
        if finding.status == "ok":
            continue
        callee_top = finding.callee.split(".")[0] or "?"
        installed = f"{callee_top} {versions.get(callee_top) or '?'}"
        name = "hs-connectors" if caller == "hs_connectors" else caller
        fix = (f"patch {name} {release or '?'} for {installed}, or install a {name} release "
               f"built for {installed}") if finding.status == "error" else unresolved_fix(finding, installed)
        scope = f" [{scoped[finding.file]}]" if finding.file in scoped else ""
        items.append(Item("api", finding.status, f"{finding.file}:{finding.line}",
                          f"{finding.code} -> {finding.detail}{scope}", fix))
    bound = sum(1 for f in findings if f.status == "ok")
    items.append(Item("api", "ok", caller, f"{bound} calls and imports into {', '.join(sorted(into))} bind"))
    return items


def required_by(index: ModuleIndex, package: str, dependency: str) -> bool:
    """Whether the installed `package` declares `dependency` (Requires-Dist in its METADATA): hs_connectors is part
    of speculators' contract with vLLM only for the speculators releases that use it (0.8 and later), not beside
    an older speculators that merely shares the env with it."""
    from specops.host.installed import distributions, normalise

    found = distributions(index.search_path).get(normalise(package))
    try:
        lines = (found.dist_info / "METADATA").read_text(errors="replace").splitlines() if found else []
    except OSError:
        return True  # cannot tell: judge it rather than stay silent
    wanted = normalise(dependency)
    return any(line.startswith("Requires-Dist:") and normalise(line.split(":", 1)[1].strip().split(";")[0].split(
        "[")[0].split("<")[0].split(">")[0].split("=")[0].split("!")[0].split("~")[0].strip()) == wanted
        for line in lines)


def _installed_version(index: ModuleIndex, package: str) -> str | None:
    """The release of an installed package, from its dist-info folder's name beside the package."""
    file = index.module_file(package)
    if file is None:
        return None
    folder = file.parent.parent if file.name == "__init__.py" else file.parent
    prefix = package.lower().replace("-", "_") + "-"
    try:
        names = [entry.name for entry in folder.iterdir() if entry.name.endswith(".dist-info")]
    except OSError:
        return None
    found = [name[len(prefix):-len(".dist-info")] for name in names if name.lower().startswith(prefix)]
    return found[0] if found else None


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
