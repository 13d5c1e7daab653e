"""The installed code as this host's fitting patch sets will leave it, for a judge that runs first.

The doctor runs before the pipeline, whose first step applies every patch set that fits the host; a
call a fitting set fixes (speculators' regenerate client loading a remote-code tokenizer without
trust_remote_code) is no error in the run that follows. `overlay_fitting_sets` reads each fitting
set's patches over the module index in memory (nothing on disk changes) and says which it overlaid,
so the doctor judges the code that will run. A patch whose anchor is not there is left out here: the
patches step refuses it loudly in its own run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specops.analysis import ModuleIndex
from specops.contract.errors import BadInput
from specops.host.gpus import host_kind
from specops.host.installed import distributions
from specops.patching.selection import Environment, fit
from specops.patching.spec import Patch, load_sets


def patched_text(text: str, patch: Patch) -> str | None:
    """`text` with the patch's replacements made; None when an anchor is not found `count` times (already
    applied, or a file the patch does not fit)."""
    for replacement in patch.replacements:
        if text.count(replacement.old) != replacement.count:
            return None
        text = text.replace(replacement.old, replacement.new)
    return text


def overlay_fitting_sets(index: ModuleIndex, search_path: list[str], patches_dir: Path | None = None
                         ) -> list[dict[str, Any]]:
    """Overlay every not yet applied patch of the sets that fit this env; one entry per set overlaid:
    {"set", "patches": [ids], "description", "reasons": [each patch's why], "files": [the files overlaid]}
    (the files: a crash whose traceback passes through one is a crash this set may fix)."""
    from specops.patching.sets import default_patches_dir

    folder = patches_dir or default_patches_dir()
    if not folder.is_dir():
        return []
    try:
        patch_sets = load_sets(folder)
    except BadInput:  # a broken spec is the patches step's one line, not the doctor's
        return []
    env = Environment(host_kind(), distributions(search_path), search_path)
    overlaid = []
    for patch_set in patch_sets:
        if not fit(patch_set, env).ok:
            continue
        ids, reasons, files = [], [], []
        for patch in patch_set.patches:
            file = index.module_file(patch.module)
            text = index.text(file) if file is not None and file.suffix == ".py" else None
            changed = patched_text(text, patch) if text is not None else None
            if file is not None and changed is not None:
                index.overlay(file, changed)
                ids.append(patch.id)
                reasons.append(patch.reason)
                files.append(str(file))
        if ids:
            overlaid.append({"set": patch_set.name, "patches": ids, "description": patch_set.description,
                             "reasons": reasons, "files": sorted(set(files))})
    return overlaid
