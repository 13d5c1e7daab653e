"""`python -m specops.compat`: the doctor's stack verdict for pairs of released versions.

Reads {"cells": [{"speculators": V, "vllm": W, "transformers": T | null, "sites": [dir, ...]}],
"patches_dir": dir} on stdin, where each site is a folder of a wheel's unpacked Python sources (the control
side fetches and unpacks them: `invoke compat`; speculators, the hs-connectors it requires, transformers,
vLLM). The cell sees those sites and the standard library only, never this interpreter's own packages, so
the verdict is the releases' and not the workstation's. Prints one JSON document: per cell the doctor's
stack findings (STACK: the API of speculators and hs_connectors into vLLM and transformers — static binding,
instances, engine loop, moved names —, the capabilities the speculators release needs from vLLM's server,
and whether vLLM serves the draft the release writes), each error with its file:line, and the patch sets in
patches/ whose version ranges cover the pair, with how many of the errors lie in the files they patch.
Nothing inspected is imported.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

from specops.contract.errors import BadInput
from specops.doctor import PIPELINE, RunSettings
from specops.doctor.checks import run_doctor

# the doctor's checks that need no run (no model folder, no host): what the releases alone decide
STACK = ("api", "capability", "serving")


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
        found.append({"name": patch_set.name, "patches": len(patch_set.patches), "errors_in_patched_files": touched,
                      "files": sorted(files)})
    return found


def patched_by(where: str, covering: list[dict]) -> list[str]:
    """The covering patch sets that patch the file a finding is in."""
    file = where.split(":")[0]
    return [c["name"] for c in covering if "error" not in c and any(file.endswith(f) for f in c.get("files", []))]


def standard_library() -> list[str]:
    """The folders of this interpreter's standard library: all a cell sees besides its wheels' sites."""
    paths = sysconfig.get_paths()
    found = [paths["stdlib"], paths["platstdlib"], str(Path(paths["platstdlib"]) / "lib-dynload")]
    return [folder for folder in dict.fromkeys(found) if Path(folder).is_dir()]


def _short(where: str, sites: list[str]) -> str:
    """A finding's place relative to the wheel it is in (speculators/x.py:12, vllm/config/speculative.py)."""
    for site in sites:
        where = where.replace(site + "/", "")
    return where


def cell(request: dict, patches_dir: Path) -> dict:
    sites = [str(Path(site).resolve()) for site in request["sites"]]
    document = run_doctor(RunSettings(), [*sites, *standard_library()], STACK)
    findings = [f for f in document["findings"] if f["check"] in STACK and not _is_pipeline(f)]
    errors = [f for f in findings if f["result"] == "error"]
    versions = document["versions"]
    first = errors[0] if errors else None
    covering = covering_sets(patches_dir, versions, errors, sites)
    return {
        "speculators": request["speculators"], "vllm": request["vllm"], "transformers": request.get("transformers"),
        "installed": {"speculators": versions.get("speculators"), "vllm": versions.get("vllm")},
        "verdict": "errors" if errors else "ok",
        "errors": len(errors),
        "unknown": sum(1 for f in findings if f["result"] == "unknown"),
        "warnings": sum(1 for f in findings if f["result"] == "warn"),
        "first": first and {"where": _short(first["where"], sites), "why": _short(first["why"], sites)},
        "error_findings": [{"check": e["check"], "where": _short(e["where"], sites), "why": _short(e["why"], sites),
                            "fix": e["fix"], "patch_sets": patched_by(e["where"], covering)} for e in errors],
        "warning_findings": [{"check": w["check"], "where": _short(w["where"], sites), "why": _short(w["why"], sites),
                              "fix": w["fix"]} for w in findings if w["result"] == "warn"],
        "covered_by": [{k: v for k, v in c.items() if k != "files"} for c in covering],
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
