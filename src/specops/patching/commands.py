"""`python -m specops patch apply|verify|status|revert|new`: the agent side of patch management.

One JSON document per call (shape in patches/README.md). Exit 0 ok, 1 a check failed or apply was
refused, 2 bad spec or usage.
"""

from __future__ import annotations

import argparse
from typing import Any

from specops.patching import authoring, sets

ACTIONS = (*sets.ACTIONS, "new")


def register(subparsers: Any) -> None:
    """`patch`: its flags and the rule of which flag goes with which action are PATCH in specops.contract.commandline
    (the builder's too)."""
    from specops.contract.commandline import PATCH

    PATCH.add_to(subparsers, handle, description=__doc__)


def handle(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    patches_dir = (args.patches_dir or sets.default_patches_dir()).resolve()
    if args.action == "new":
        return authoring.handle(args, patches_dir)
    document = sets.run_action(args.action, args.sets, patches_dir=patches_dir, dry_run=args.dry_run,
                               deep=args.deep)
    return (0 if document["ok"] else 1), document
