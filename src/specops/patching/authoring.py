"""`patch new`: write a patch file from the difference between an installed file and an edited copy.

Each changed hunk becomes one [[replace]] whose `old` grows by whole lines of context until it
occurs exactly once in the installed file; hunks whose context meets are merged.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
from pathlib import Path
from typing import Any

from specops.contract.errors import BadInput
from specops.contract.protocol import name_problem
from specops.host import atomic
from specops.patching.rewrite import apply_patches
from specops.patching.selection import Environment
from specops.patching.spec import SET_FILE, load_patch, load_set

Hunk = tuple[int, int, int, int]  # old[i1:i2] -> new[j1:j2], in lines


def replacements(before: str, after: str) -> list[tuple[str, str]]:
    """(old, new) pairs that turn `before` into `after`, each `old` unique in `before`."""
    old_lines = before.splitlines(keepends=True)
    new_lines = after.splitlines(keepends=True)
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    hunks: list[Hunk] = [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]
    while True:
        grown = [_grow(h, old_lines, new_lines, before) for h in hunks]
        merged = _merge(grown)
        if merged == hunks:
            break
        hunks = merged
    return [("".join(old_lines[i1:i2]), "".join(new_lines[j1:j2])) for i1, i2, j1, j2 in hunks]


def _grow(hunk: Hunk, old_lines: list[str], new_lines: list[str], before: str) -> Hunk:
    i1, i2, j1, j2 = hunk
    # context lines are equal on both sides, so old and new ranges grow together
    while True:
        old = "".join(old_lines[i1:i2])
        if old.strip() and before.count(old) == 1:
            return i1, i2, j1, j2
        if i1 == 0 and i2 == len(old_lines):
            return i1, i2, j1, j2
        if i1 > 0:
            i1, j1 = i1 - 1, j1 - 1
        if i2 < len(old_lines):
            i2, j2 = i2 + 1, j2 + 1


def _merge(hunks: list[Hunk]) -> list[Hunk]:
    merged: list[Hunk] = []
    for hunk in hunks:
        if merged and hunk[0] <= merged[-1][1]:
            last = merged[-1]
            merged[-1] = (last[0], max(last[1], hunk[1]), last[2], max(last[3], hunk[3]))
        else:
            merged.append(hunk)
    return merged


def toml_string(text: str) -> str:
    """A TOML string that reads back as exactly `text`: multi-line literal where possible."""
    literal_ok = "'''" not in text and not text.endswith("'") and not re.search(r"[\x00-\x08\x0b-\x1f\x7f]",
                                                                                 text.replace("\r\n", "\n"))
    if literal_ok:
        return "'''\n" + text + "'''"  # TOML drops the newline right after the opening quotes
    return json.dumps(text)  # JSON escapes are valid TOML basic-string escapes


def render(patch_id: str, reason: str, module: str, pairs: list[tuple[str, str]]) -> str:
    lines = [f"id = {json.dumps(patch_id)}", f"reason = {json.dumps(reason)}", f"module = {json.dumps(module)}",
             'checks = ["parses", "calls_bind", "imports_resolve"]', ""]
    for old, new in pairs:
        lines += ["[[replace]]", "count = 1", f"old = {toml_string(old)}", f"new = {toml_string(new)}", ""]
    return "\n".join(lines)


def handle(args: argparse.Namespace, patches_dir: Path) -> tuple[int, dict[str, Any]]:
    if getattr(args, "from_finding", None):
        return handle_from_finding(args, patches_dir)
    for flag, value in (("--module", args.module), ("--edited", args.edited), ("--id", args.patch_id),
                        ("--reason", args.reason)):
        if not value:
            raise BadInput(f"patch new: {flag} is required")
    if not args.sets or len(args.sets) != 1:
        raise BadInput("patch new: give exactly one --set NAME")
    problem = name_problem(args.sets[0])  # the set's name is a folder under patches/
    if problem is not None:
        raise BadInput(f"patch new --set: {problem}")
    folder = patches_dir / args.sets[0]
    if not (folder / SET_FILE).is_file():
        raise BadInput(f"{folder / SET_FILE}: missing; create the set's {SET_FILE} first (see patches/README.md)")
    patch_set = load_set(folder) if any(p.name != SET_FILE for p in folder.glob("*.toml")) else None
    if patch_set and any(p.id == args.patch_id for p in patch_set.patches):
        raise BadInput(f"--id {args.patch_id}: set {args.sets[0]} already has a patch with this id")
    installed = Environment.current().source_file(args.module)
    if installed is None:
        raise BadInput(f"--module {args.module}: no Python source for it on this interpreter's search path")
    if not args.edited.is_file():
        raise BadInput(f"--edited {args.edited}: no such file")
    before, after = installed.read_text(), args.edited.read_text()
    if before == after:
        raise BadInput(f"--edited {args.edited}: identical to the installed {installed}; nothing to patch")
    pairs = replacements(before, after)
    numbers = [int(m.group(1)) for p in folder.glob("*.toml") if (m := re.match(r"(\d+)-", p.name))]
    target = folder / f"{max(numbers, default=0) + 1:02d}-{args.patch_id}.toml"
    text = render(args.patch_id, args.reason, args.module, pairs)
    atomic.write_text(target, text)
    # what we write must read back under the same strict rules and reproduce the edited file
    try:
        written = load_patch(target)
    except BadInput:
        target.unlink()
        raise
    result, misfits = apply_patches(before, [written], str(installed))
    if misfits or result != after:
        target.unlink()
        raise BadInput(f"--edited {args.edited}: could not express the edit as unique replacements "
                       f"({'; '.join(m.detail for m in misfits) or 'result differs'})")
    # The text travels back too: the workstation keeps patch sets in its checkout.
    return 0, {"ok": True, "action": "new", "written": str(target), "set": args.sets[0], "id": args.patch_id,
               "module": args.module, "file": str(installed), "replacements": len(pairs),
               "patch_file_relative": f"{args.sets[0]}/{target.name}", "patch_text": text}


def _target_set(args: argparse.Namespace, patches_dir: Path, patch_id: str) -> tuple[Path, Path]:
    if not args.sets or len(args.sets) != 1:
        raise BadInput("patch new: give exactly one --set NAME")
    folder = patches_dir / args.sets[0]
    if not (folder / SET_FILE).is_file():
        raise BadInput(f"{folder / SET_FILE}: missing; create the set's {SET_FILE} first (see patches/README.md)")
    patch_set = load_set(folder) if any(p.name != SET_FILE for p in folder.glob("*.toml")) else None
    if patch_set and any(p.id == patch_id for p in patch_set.patches):
        raise BadInput(f"--id {patch_id}: set {args.sets[0]} already has a patch with this id")
    numbers = [int(m.group(1)) for p in folder.glob("*.toml") if (m := re.match(r"(\d+)-", p.name))]
    return folder, folder / f"{max(numbers, default=0) + 1:02d}-{patch_id}.toml"


def handle_from_finding(args: argparse.Namespace, patches_dir: Path) -> tuple[int, dict[str, Any]]:
    """`patch new --from-finding ID --set NAME`: the doctor's finding, re-found by id on this host,
    turned into a patch that is replayed (dry run) and bound before it is written."""
    import sys
    import tempfile

    from specops.doctor import diagnose
    from specops.patching import from_finding

    if not args.sets or len(args.sets) != 1:
        raise BadInput("patch new: give exactly one --set NAME")
    document = diagnose(list(sys.path), None, ("api",))
    finding = from_finding.find(document, args.from_finding)
    proposal = from_finding.propose(finding)
    patch_id = args.patch_id or proposal.patch_id
    folder, target = _target_set(args, patches_dir, patch_id)
    reason = args.reason or proposal.reason
    text = render(patch_id, reason, proposal.module, replacements(proposal.before, proposal.after))
    with tempfile.TemporaryDirectory() as scratch:  # read back under the strict rules before it lands
        trial = Path(scratch) / target.name
        trial.write_text(text)
        written = load_patch(trial)
    result, misfits = apply_patches(proposal.before, [written], str(proposal.file))
    if misfits or result != proposal.after:
        raise BadInput(f"--from-finding {args.from_finding}: the proposed edit does not replay as unique "
                       f"replacements ({'; '.join(m.detail for m in misfits) or 'result differs'})")
    broken = from_finding.still_broken(proposal)
    summary = {"action": "new", "finding": finding, "module": proposal.module, "file": str(proposal.file),
               "proposed_diff": _diff(proposal)}
    if broken:
        return 1, {"ok": False, **summary, "error": f"the proposed patch does not bind: {'; '.join(broken)}"}
    atomic.write_text(target, text)
    return 0, {"ok": True, **summary, "written": str(target), "set": folder.name, "id": patch_id,
               "replacements": text.count("[[replace]]"), "bound": True,
               "placeholders": (proposal.after.count("specops: placeholder")
                                - proposal.before.count("specops: placeholder")),
               "patch_file_relative": f"{folder.name}/{target.name}", "patch_text": text}


def _diff(proposal: Any) -> str:
    return "".join(difflib.unified_diff(proposal.before.splitlines(keepends=True),
                                        proposal.after.splitlines(keepends=True),
                                        f"a/{proposal.module}", f"b/{proposal.module}", n=1))
