"""Locate, apply, verify and revert patches to installed packages (standard library only).

The face other code calls: `apply_sets`, `verify_sets`, `status_sets`, `revert_sets`, each returning
one JSON-ready document; `python -m specops patch ...` is the same calls behind argparse.
"""

from specops.patching.sets import apply_sets, revert_sets, status_sets, verify_sets

__all__ = ["apply_sets", "revert_sets", "status_sets", "verify_sets"]
