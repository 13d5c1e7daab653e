"""`python -m specops patch apply|verify|status|revert|new`: the agent side of patch management.

One JSON document per call (shape in patches/README.md). Exit 0 ok, 1 a check failed or apply was
refused, 2 bad spec or usage.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from specops import paths
from specops.errors import BadInput
from specops.patching import authoring, engine
from specops.patching.checks import verify
from specops.patching.selection import Environment, Fit, fit
from specops.patching.spec import PatchSet, load_sets

ACTIONS = ("apply", "verify", "status", "revert", "new")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("patch", help="apply, verify, revert or write patches to installed packages",
                                   description=__doc__)
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("--set", dest="sets", action="append", metavar="NAME",
                        help="patch set folder name (repeatable); default: every set that fits this host")
    parser.add_argument("--dry-run", action="store_true", help="apply: show the diff, write nothing")
    parser.add_argument("--deep", action="store_true", help="verify: also import each target in a subprocess")
    parser.add_argument("--patches-dir", type=Path, help="default: <workdir>/patches")
    parser.add_argument("--module", help="new: dotted name of the installed module the patch targets")
    parser.add_argument("--edited", type=Path, help="new: an edited copy of the installed file")
    parser.add_argument("--id", dest="patch_id", help="new: id of the new patch")
    parser.add_argument("--reason", help="new: one line saying why the patch is needed")
    parser.add_argument("--from-finding", metavar="ID",
                        help="new: propose the patch for this doctor finding (its id in `doctor --json`)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    patches_dir = (args.patches_dir or paths.workdir() / "patches").resolve()
    if args.action == "new":
        return authoring.handle(args, patches_dir)
    for flag, value in (("--module", args.module), ("--edited", args.edited), ("--id", args.patch_id),
                        ("--reason", args.reason)):
        if value is not None:
            raise BadInput(f"patch {args.action}: {flag} only goes with 'patch new'")
    if args.dry_run and args.action != "apply":
        raise BadInput(f"patch {args.action}: --dry-run only goes with 'patch apply'")
    if args.deep and args.action != "verify":
        raise BadInput(f"patch {args.action}: --deep only goes with 'patch verify'")
    env = Environment.current()
    explicit = bool(args.sets)
    document: dict[str, Any] = {"ok": True, "action": args.action, "patches_dir": str(patches_dir),
                                "host": env.host, "dry_run": args.dry_run, "sets": []}
    if args.action == "verify":
        document["checks"] = []
        document["analysis"] = {"files_parsed": 0}
    if args.action == "status":
        document["lines"] = []
    for patch_set in load_sets(patches_dir, args.sets):
        set_fit = fit(patch_set, env)
        entry = _set_entry(patch_set, set_fit)
        document["sets"].append(entry)
        skip = not set_fit.ok and not explicit and args.action in ("apply", "verify")
        if skip:
            entry.update(result="not applicable", detail=entry["reason"])
            continue
        ACTION_HANDLERS[args.action](patch_set, set_fit, env, entry, document, args)
        document["ok"] = document["ok"] and entry["ok"]
    return (0 if document["ok"] else 1), document


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


def _apply(patch_set: PatchSet, set_fit: Fit, env: Environment, entry: dict[str, Any], document: dict[str, Any],
           args: argparse.Namespace) -> None:
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
                      ("would apply" if args.dry_run else "applied"))
               for t in targets for p in t.patches}
    entry["patches"] = _patch_entries(targets, results)
    entry["diff"] = engine.diff(targets)
    if not pending:
        entry.update(result="already applied", detail="every patch is applied; nothing written")
    elif args.dry_run:
        entry.update(result="would apply", detail=f"dry run: {len(pending)} file(s) would change; nothing written")
    else:
        engine.write(patch_set, targets, env)
        entry.update(result="applied", detail=f"{len(pending)} file(s) patched")


def _verify(patch_set: PatchSet, set_fit: Fit, env: Environment, entry: dict[str, Any], document: dict[str, Any],
            args: argparse.Namespace) -> None:
    targets = engine.plan(patch_set, env)
    checks = verify(patch_set, targets, set_fit, env, deep=args.deep)
    failed = [c for c in checks if not c["ok"]]
    entry.update(ok=not failed, result="ok" if not failed else "failed",
                 detail=f"{len(checks) - len(failed)}/{len(checks)} checks passed",
                 patches=_patch_entries(targets))
    document["checks"].extend(checks)
    document["analysis"]["files_parsed"] = env.index.files_parsed  # one index for all sets


def _status(patch_set: PatchSet, set_fit: Fit, env: Environment, entry: dict[str, Any], document: dict[str, Any],
            args: argparse.Namespace) -> None:
    targets = engine.plan(patch_set, env)
    versions = [f"{patch_set.package} {set_fit.installed or 'not installed'} (wants {patch_set.version})"]
    versions += [f"{name} {info['installed'] or 'not installed'} (wants {info['wants']})"
                 for name, info in set_fit.requires.items()]
    entry["patches"] = _patch_entries(targets)
    entry.update(result="applicable" if set_fit.ok else "not applicable", detail=entry["reason"] or "")
    for patch in entry["patches"]:
        patch["line"] = f"{patch_set.name} {patch['id']}: {engine.STATES[patch['state']]}; {', '.join(versions)}"
        document["lines"].append(patch["line"])


def _revert(patch_set: PatchSet, set_fit: Fit, env: Environment, entry: dict[str, Any], document: dict[str, Any],
            args: argparse.Namespace) -> None:
    restored, problems = engine.revert(patch_set, env)
    entry["restored"] = restored
    if problems:
        entry.update(ok=False, result="refused", detail="; ".join(problems), refusals=problems)
    elif restored:
        entry.update(result="reverted", detail=f"{len(restored)} file(s) restored byte-identical")
    else:
        entry.update(result="nothing to revert", detail="no file of this set is patched")
    entry["patches"] = _patch_entries(engine.plan(patch_set, env))


ACTION_HANDLERS = {"apply": _apply, "verify": _verify, "status": _status, "revert": _revert}
