"""`python -m specops.compat`: the doctor's stack verdict for pairs of released versions.

Reads {"cells": [{"speculators": V, "vllm": W, "sites": [dir, ...]}], "patches_dir": dir} on stdin,
where each site is a folder of a wheel's unpacked Python sources (the control side fetches and
unpacks them: `invoke compat`). Prints one JSON document: per cell the API errors (static binding,
instances, engine loop, moved names), the first finding, and the patch sets in patches/ whose
version ranges cover the pair, with how many of the errors lie in the files they patch.
Nothing inspected is imported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specops.doctor import PIPELINE, RunSettings
from specops.doctor.checks import run_doctor
from specops.errors import BadInput


def _is_pipeline(finding: dict) -> bool:
    return finding["where"] == "specops.pipeline" or finding["where"].startswith(str(PIPELINE))


def covering_sets(patches_dir: Path, versions: dict[str, str | None], errors: list[dict], sites: list[str]
                  ) -> list[dict]:
    from specops.patching.spec import load_sets

    try:
        sets = load_sets(patches_dir)
    except BadInput as exc:
        return [{"name": "?", "error": str(exc)}]
    found = []
    for patch_set in sets:
        installed = versions.get(patch_set.package)
        if installed is None or not patch_set.version.contains(installed):
            continue
        if any(versions.get(name) is None or not spec.contains(versions[name])  # type: ignore[arg-type]
               for name, spec in patch_set.requires.items()):
            continue
        files = {"/".join(module.split(".")) + ".py" for module in patch_set.modules()}
        touched = sum(1 for e in errors if any(e["where"].split(":")[0].endswith(f) for f in files))
        found.append({"name": patch_set.name, "patches": len(patch_set.patches), "errors_in_patched_files": touched})
    return found


def cell(request: dict, patches_dir: Path) -> dict:
    sites = [str(Path(site).resolve()) for site in request["sites"]]
    document = run_doctor(RunSettings(), [*sites, *sys.path], ("api",))
    findings = [f for f in document["findings"] if f["check"] == "api" and not _is_pipeline(f)]
    errors = [f for f in findings if f["result"] == "error"]
    versions = document["versions"]
    first = errors[0] if errors else None
    return {
        "speculators": request["speculators"], "vllm": request["vllm"],
        "installed": {"speculators": versions.get("speculators"), "vllm": versions.get("vllm")},
        "verdict": "errors" if errors else "ok",
        "errors": len(errors),
        "unknown": sum(1 for f in findings if f["result"] == "unknown"),
        "warnings": sum(1 for f in findings if f["result"] == "warn"),
        "first": first and {"where": first["where"].replace(sites[0] + "/", "").replace(sites[-1] + "/", ""),
                            "why": first["why"]},
        "error_findings": [{"where": e["where"], "why": e["why"]} for e in errors],
        "covered_by": covering_sets(patches_dir, versions, errors, sites),
        "seconds": document["timing_s"]["total"],
    }


def main() -> int:
    request = json.load(sys.stdin)
    patches_dir = Path(request["patches_dir"])
    cells = [cell(one, patches_dir) for one in request["cells"]]
    print(json.dumps({"ok": True, "cells": cells}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
