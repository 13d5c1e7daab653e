"""Patch actions over the patch sets that fit this host: the patching API the CLI and the pipeline share.

Each function returns one JSON-ready document (shape in patches/README.md) whose "ok" says whether
every set it acted on is fine. Sets that do not fit this host are listed and skipped by apply and
verify, unless they were named.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specops.host import paths
from specops.patching import engine
from specops.patching.checks import verify
from specops.patching.selection import Environment, Fit, fit
from specops.patching.spec import PatchSet, load_sets

ACTIONS = ("apply", "verify", "status", "revert")


def apply_sets(sets: Sequence[str] | None = None, *, patches_dir: Path | None = None,
               dry_run: bool = False) -> dict[str, Any]:
    """Apply the named sets (default: every set that fits this host); with dry_run, write nothing."""
    return run_action("apply", sets, patches_dir=patches_dir, dry_run=dry_run)


def verify_sets(sets: Sequence[str] | None = None, *, patches_dir: Path | None = None,
                deep: bool = False) -> dict[str, Any]:
    """Verify the named sets (default: every set that fits): applied, and every patched call binds.
    The document's "checks" lists each check with its "ok"."""
    return run_action("verify", sets, patches_dir=patches_dir, deep=deep)


def status_sets(sets: Sequence[str] | None = None, *, patches_dir: Path | None = None) -> dict[str, Any]:
    return run_action("status", sets, patches_dir=patches_dir)


def revert_sets(sets: Sequence[str] | None = None, *, patches_dir: Path | None = None) -> dict[str, Any]:
    return run_action("revert", sets, patches_dir=patches_dir)


def default_patches_dir() -> Path:
    return paths.workdir() / "patches"


def run_action(action: str, sets: Sequence[str] | None = None, *, patches_dir: Path | None = None,
               dry_run: bool = False, deep: bool = False) -> dict[str, Any]:
    if action not in ACTIONS:
        raise ValueError(f"unknown patch action {action!r}")
    patches_dir = (patches_dir or default_patches_dir()).resolve()
    env = Environment.current()
    explicit = bool(sets)
    document: dict[str, Any] = {"ok": True, "action": action, "patches_dir": str(patches_dir),
                                "host": env.host, "dry_run": dry_run, "sets": []}
    if action == "verify":
        document["checks"] = []
        document["analysis"] = {"files_parsed": 0}
    if action == "status":
        document["lines"] = []
    for patch_set in load_sets(patches_dir, list(sets) if sets else None):
        set_fit = fit(patch_set, env)
        entry = _set_entry(patch_set, set_fit)
        document["sets"].append(entry)
        if not set_fit.ok and not explicit and action in ("apply", "verify"):
            entry.update(result="not applicable", detail=entry["reason"])
            continue
        _HANDLERS[action](patch_set, set_fit, env, entry, document, dry_run=dry_run, deep=deep)
        document["ok"] = document["ok"] and entry["ok"]
    return document


def _set_entry(patch_set: PatchSet, set_fit: Fit) -> dict[str, Any]:
    return {
        "name": patch_set.name, "package": patch_set.package, "wants": str(patch_set.version),
        "installed": set_fit.installed, "requires": set_fit.requires, "host": patch_set.host,
        "description": patch_set.description, "applicable": set_fit.ok,
        "reason": None if set_fit.ok else f"not applicable ({'; '.join(set_fit.problems)})",
        "ok": True, "result": None, "detail": "", "patches": [],
    }


def _patch_entries(targets: list[engine.Target], result: dict[str, str] | None = None) -> list[dict[str, Any]]:
    entries = []
    for target in targets:
        for patch in target.patches:
            entries.append({"id": patch.id, "reason": patch.reason, "module": target.module,
                            "file": str(target.file) if target.file else None, "state": target.state,
                            "detail": target.detail, "result": (result or {}).get(patch.id)})
    return entries


def _apply(patch_set: PatchSet, set_fit: Fit, env: Environment,
           entry: dict[str, Any], document: dict[str, Any], *, dry_run: bool, deep: bool) -> None:
    targets = engine.plan(patch_set, env)
    problems = list(set_fit.problems) + engine.refusals(targets)
    if problems:
        misfit_ids = {m.patch for t in targets for m in t.misfits}
        results = {p.id: ("refused" if p.id in misfit_ids else "not written") for p in patch_set.patches}
        entry.update(ok=False, result="refused", detail="; ".join(problems), refusals=problems,
                     patches=_patch_entries(targets, results))
        return
    pending = [t for t in targets if t.state != "applied"]
    results = {p.id: ("already applied" if t.state == "applied" else
                      ("would apply" if dry_run else "applied"))
               for t in targets for p in t.patches}
    entry["patches"] = _patch_entries(targets, results)
    entry["diff"] = engine.diff(targets)
    if not pending:
        entry.update(result="already applied", detail="every patch is applied; nothing written")
    elif dry_run:
        entry.update(result="would apply", detail=f"dry run: {len(pending)} file(s) would change; nothing written")
    else:
        engine.write(patch_set, targets, env)
        entry.update(result="applied", detail=f"{len(pending)} file(s) patched")


def _verify(patch_set: PatchSet, set_fit: Fit, env: Environment,
            entry: dict[str, Any], document: dict[str, Any], *, dry_run: bool, deep: bool) -> None:
    targets = engine.plan(patch_set, env)
    checks = verify(patch_set, targets, set_fit, env, deep=deep)
    failed = [c for c in checks if not c["ok"]]
    entry.update(ok=not failed, result="ok" if not failed else "failed",
                 detail=f"{len(checks) - len(failed)}/{len(checks)} checks passed",
                 patches=_patch_entries(targets))
    document["checks"].extend(checks)
    document["analysis"]["files_parsed"] = env.index.files_parsed  # one index for all sets


def _status(patch_set: PatchSet, set_fit: Fit, env: Environment,
            entry: dict[str, Any], document: dict[str, Any], *, dry_run: bool, deep: bool) -> None:
    targets = engine.plan(patch_set, env)
    versions = [f"{patch_set.package} {set_fit.installed or 'not installed'} (wants {patch_set.version})"]
    versions += [f"{name} {info['installed'] or 'not installed'} (wants {info['wants']})"
                 for name, info in set_fit.requires.items()]
    entry["patches"] = _patch_entries(targets)
    entry.update(result="applicable" if set_fit.ok else "not applicable", detail=entry["reason"] or "")
    for patch in entry["patches"]:
        patch["line"] = f"{patch_set.name} {patch['id']}: {engine.STATES[patch['state']]}; {', '.join(versions)}"
        document["lines"].append(patch["line"])


def _revert(patch_set: PatchSet, set_fit: Fit, env: Environment,
            entry: dict[str, Any], document: dict[str, Any], *, dry_run: bool, deep: bool) -> None:
    restored, problems = engine.revert(patch_set, env)
    entry["restored"] = restored
    if problems:
        entry.update(ok=False, result="refused", detail="; ".join(problems), refusals=problems)
    elif restored:
        entry.update(result="reverted", detail=f"{len(restored)} file(s) restored byte-identical")
    else:
        entry.update(result="nothing to revert", detail="no file of this set is patched")
    entry["patches"] = _patch_entries(engine.plan(patch_set, env))


_HANDLERS = {"apply": _apply, "verify": _verify, "status": _status, "revert": _revert}
