"""verify: the structured checks that prove a set is applied and fits the installed code.

Per patch: `state`. Per target file (union of what its patches ask for): `parses`, `calls_bind`,
`imports_resolve` (static, via specops.analysis). Per set: `versions`. `--deep` adds `imports_live`
(the target imported in a subprocess of this interpreter) and `calls_live` (each call the static pass
resolved, bound there with inspect.signature against the imported callee).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specops.analysis import Finding, bind_live, check_calls, check_imports
from specops.patching.engine import Target
from specops.patching.selection import Environment, Fit
from specops.patching.spec import FILE_CHECKS, Patch, PatchSet

DEEP_TIMEOUT_S = 300.0  # importing vLLM takes tens of seconds on a cold host


def _check(patch_set: PatchSet, check: str, ok: bool, detail: str, *, patch: str | None = None,
           target: str | None = None, file: Path | None = None, status: str | None = None,
           findings: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"set": patch_set.name, "patch": patch, "target": target, "file": str(file) if file else None,
            "check": check, "ok": ok, "status": status or ("ok" if ok else "error"), "detail": detail,
            "findings": findings or []}


def _parses(source: bytes, file: Path) -> tuple[bool, str]:
    try:
        compile(source, str(file), "exec", dont_inherit=True)
    except SyntaxError as exc:
        return False, f"{file}:{exc.lineno}: {exc.msg}"
    return True, "compiles"


def _finding(item: Any) -> dict[str, Any]:
    return {key: getattr(item, key, None) for key in ("status", "file", "line", "code", "callee", "detail")}


def _describe(finding: dict[str, Any]) -> str:
    code = (finding["code"] or finding["callee"] or "").strip().replace("\n", " ")
    if len(code) > 70:
        code = code[:67] + "..."
    return f"{finding['file']}:{finding['line']}: {code}: {finding['detail']}"


def patched_lines(text: str, patches: list[Patch]) -> set[int]:
    """Lines of `text` that a patch's `old` or `new` text covers: the patch author's own code."""
    lines: set[int] = set()
    for patch in patches:
        for replacement in patch.replacements:
            for needle in (replacement.old, replacement.new):
                start = text.find(needle)
                while start != -1:
                    first = text.count("\n", 0, start) + 1
                    lines.update(range(first, first + max(needle.count("\n"), 1)))
                    start = text.find(needle, start + 1)
    return lines


def _summarise(noun: str, found: list[Finding]) -> tuple[str, str, list[dict[str, Any]]]:
    """(status, detail, findings) of one analysis check. Errors fail, unknowns are only reported."""
    findings = [_finding(item) for item in found]
    errors = [f for f in findings if f["status"] == "error"]
    unknowns = [f for f in findings if f["status"] == "unknown"]
    if errors:
        detail = "; ".join(_describe(f) for f in errors)
        if unknowns:
            detail += f" ({len(unknowns)} {noun} unresolved)"
        return "error", detail, findings
    resolved = len(findings) - len(unknowns)
    # what could not be resolved is in `findings` (and in `invoke patch verify --verbose`), not in the line
    verb = "bound" if noun == "calls" else "resolved"
    detail = f"{resolved} {verb}, {len(unknowns)} not resolved" if unknowns else f"{resolved} {noun} {verb}"
    return ("unknown" if unknowns and not resolved else "ok"), detail, findings


def verify(patch_set: PatchSet, targets: list[Target], fit: Fit, env: Environment, *,
           deep: bool = False, deep_timeout: float = DEEP_TIMEOUT_S) -> list[dict[str, Any]]:
    results = [_check(patch_set, "versions", fit.ok, "; ".join(fit.problems) or _versions_line(patch_set, fit),
                      target=patch_set.package)]
    # Calls are bound into what the set vouches for (its package and [requires]) and, on the patches'
    # own lines, into anything: a set says nothing about torch's API unless it lists torch, and
    # resolving names through torch's and transformers' lazy __init__ costs more than the rest.
    packages = set().union(*(env.import_names(name) for name in [patch_set.package, *patch_set.requires]))
    for target in targets:
        for patch in target.patches:
            results.append(_check(patch_set, "state", target.state == "applied", target.detail,
                                  patch=patch.id, target=target.module, file=target.file,
                                  status=target.state))
        if target.file is None or target.current is None:
            continue
        wanted = [name for name in FILE_CHECKS if any(name in patch.checks for patch in target.patches)]
        parses, parse_detail = _parses(target.current, target.file)
        calls: list[Finding] | None = None
        if parses and ("calls_bind" in wanted or deep):
            own_lines = patched_lines(target.current.decode("utf-8", errors="replace"), target.patches)
            calls = check_calls(target.file, env.index, packages=packages, any_package_lines=own_lines)
        for name in wanted:
            if name == "parses":
                results.append(_check(patch_set, name, parses, parse_detail, target=target.module,
                                      file=target.file))
                continue
            if not parses:
                results.append(_check(patch_set, name, False, "not checked: the file does not compile",
                                      target=target.module, file=target.file))
                continue
            found = calls if name == "calls_bind" else check_imports(target.file, env.index)
            assert found is not None
            status, detail, findings = _summarise("calls" if name == "calls_bind" else "imports", found)
            results.append(_check(patch_set, name, status != "error", detail, target=target.module,
                                  file=target.file, status=status, findings=findings))
        if deep:
            results.extend(_live(patch_set, target, calls or [], deep_timeout))
    return results


def _live(patch_set: PatchSet, target: Target, calls: list[Finding], timeout: float) -> list[dict[str, Any]]:
    """imports_live and calls_live: the target imported by this interpreter in a child process, and each
    call the static pass resolved bound there against the imported callee."""
    module_error, live = bind_live(target.module, calls, timeout=timeout)
    imported = module_error is None
    results = [_check(patch_set, "imports_live", imported,
                      f"import {target.module} succeeded" if imported else f"import {target.module} failed: "
                      f"{module_error}", target=target.module, file=target.file)]
    status, detail, findings = _summarise("calls", live)
    if not imported:  # nothing was bound: say why once, not per call
        status, detail = "unknown", f"{len(live)} calls not bound: import {target.module} failed"
    results.append(_check(patch_set, "calls_live", status != "error", detail, target=target.module,
                          file=target.file, status=status, findings=findings))
    return results


def _versions_line(patch_set: PatchSet, fit: Fit) -> str:
    parts = [f"{patch_set.package} {fit.installed} satisfies {patch_set.version}"]
    parts += [f"{name} {info['installed']} satisfies {info['wants']}" for name, info in fit.requires.items()]
    return "; ".join(parts)
