"""`python -m specops patch apply|verify|status|revert|new`: the agent side of patch management.

One JSON document per call (shape in patches/README.md). Exit 0 ok, 1 a check failed or apply was
refused, 2 bad spec or usage.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from specops.errors import BadInput
from specops.patching import authoring, sets

ACTIONS = (*sets.ACTIONS, "new")


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
    patches_dir = (args.patches_dir or sets.default_patches_dir()).resolve()
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
    document = sets.run_action(args.action, args.sets, patches_dir=patches_dir, dry_run=args.dry_run,
                               deep=args.deep)
    return (0 if document["ok"] else 1), document
