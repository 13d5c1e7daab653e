"""verify: the structured checks that prove a set is applied and fits the installed code.

Per patch: `state`. Per target file (union of what its patches ask for): `parses`, `calls_bind`,
`imports_resolve` (static, via specops.analysis). Per set: `versions`. `--deep` adds `imports_live`:
the target imported in a subprocess of this interpreter.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from specops.analysis import ModuleIndex, check_calls, check_imports
from specops.patching.engine import Target
from specops.patching.selection import Environment, Fit
from specops.patching.spec import FILE_CHECKS, PatchSet


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


def _static(check: str, file: Path, index: ModuleIndex) -> tuple[str, str, list[dict[str, Any]]]:
    """Run one analysis check; (status, detail, findings). Errors fail, unknowns are only reported."""
    run = check_calls if check == "calls_bind" else check_imports
    findings = [_finding(item) for item in run(file, index)]
    errors = [f for f in findings if f["status"] == "error"]
    unknowns = [f for f in findings if f["status"] == "unknown"]
    noun = "calls" if check == "calls_bind" else "imports"
    if errors:
        detail = "; ".join(_describe(f) for f in errors)
        if unknowns:
            detail += f" ({len(unknowns)} {noun} unresolved)"
        return "error", detail, findings
    resolved = len(findings) - len(unknowns)
    detail = f"{resolved} {noun} checked"
    if unknowns:
        detail += f", {len(unknowns)} unresolved: " + "; ".join(_describe(f) for f in unknowns[:5])
    return ("unknown" if unknowns and not resolved else "ok"), detail, findings


def _imports_live(module: str) -> tuple[bool, str]:
    result = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True,
                            timeout=600)
    if result.returncode == 0:
        return True, f"import {module} succeeded"
    last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
    return False, f"import {module} failed: {last}"


def verify(patch_set: PatchSet, targets: list[Target], fit: Fit, env: Environment, *,
           deep: bool = False) -> list[dict[str, Any]]:
    results = [_check(patch_set, "versions", fit.ok, "; ".join(fit.problems) or _versions_line(patch_set, fit),
                      target=patch_set.package)]
    for target in targets:
        for patch in target.patches:
            results.append(_check(patch_set, "state", target.state == "applied", target.detail,
                                  patch=patch.id, target=target.module, file=target.file,
                                  status=target.state))
        if target.file is None or target.current is None:
            continue
        wanted = [name for name in FILE_CHECKS if any(name in patch.checks for patch in target.patches)]
        for name in wanted:
            if name == "parses":
                ok, detail = _parses(target.current, target.file)
                results.append(_check(patch_set, name, ok, detail, target=target.module, file=target.file))
                continue
            status, detail, findings = _static(name, target.file, env.index)
            results.append(_check(patch_set, name, status != "error", detail, target=target.module,
                                  file=target.file, status=status, findings=findings))
        if deep:
            ok, detail = _imports_live(target.module)
            results.append(_check(patch_set, "imports_live", ok, detail, target=target.module, file=target.file))
    return results


def _versions_line(patch_set: PatchSet, fit: Fit) -> str:
    parts = [f"{patch_set.package} {fit.installed} satisfies {patch_set.version}"]
    parts += [f"{name} {info['installed']} satisfies {info['wants']}" for name, info in fit.requires.items()]
    return "; ".join(parts)
