"""Task: `compat` — the compatibility matrix of released speculators × vLLM (× transformers), on the workstation.

Each version's wheel is fetched with `pip download --no-deps` into a cache and only its Python sources
are unpacked (remote/wheel_cache.py); each cell is judged by the doctor's stack checks (specops.compat.STACK:
the API of speculators and hs_connectors into vLLM and transformers, the capabilities the speculators release
needs from vLLM's server, whether vLLM serves its draft) in a local python subprocess running the agent's own
code, over the wheels' sources and the standard library only, so nothing is imported here, the workstation's
own packages are not what is judged, and no GPU host is needed.

The transformers axis: `--transformers V,...` judges each pair under each given release. Without it, each
cell takes the newest transformers release that every pin on the speculators env allows — speculators' own
`Requires-Dist`, and vLLM's too where speculators < 0.5 runs vLLM in its own process (vLLM ≥ 0.5's pipeline
talks to a vLLM server in its own env, whose transformers is vLLM's business): what `pip install` would pick.
The hs-connectors release a speculators release pins is judged beside it. torch (base classes only) is the
workstation's own, linked in: its nn.Module is what a model class's missing method is proven absent against.
Each error names the fix: a patch set in patches/ that patches its file, or the nearest vLLM release of the
matrix where it is gone.
"""

from __future__ import annotations

import json as json_module
import os
import sys
import time
from typing import Any

from invoke import task

from remote.errors import AgentError, BadInput, SpecopsError
from remote.session import emit_json, reports_errors

# wheel_cache (zipfile, shutil), the inventory, concurrent.futures and rich load inside the task:
# every other task starts without them.

DEFAULT_SPECULATORS = ("0.3.0", "0.4.0.1", "0.9.0")
DEFAULT_VLLM = ("0.16.0", "0.33.0")
CELL_TIMEOUT_S = 900
DEFAULT_TRANSFORMERS = "default"  # the row label of cells whose transformers the pins chose


def versions(flag: str, given: list[str] | None, default: tuple[str, ...]) -> list[str]:
    """`--vllm 0.16.0 --vllm 0.33.0` or `--vllm 0.16.0,0.33.0`, checked; the defaults when not given."""
    from remote import wheel_cache

    found = [part.strip() for value in given or [] for part in value.split(",") if part.strip()] or list(default)
    return [wheel_cache.check_version(flag, version) for version in dict.fromkeys(found)]


def judge(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Run the agent's compat module on some cells in a local python; its one JSON document."""
    import subprocess

    from remote.inventory import REPO_ROOT

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT / "src"),
                                                                      os.environ.get("PYTHONPATH")]))}
    request = {"cells": cells, "patches_dir": str(REPO_ROOT / "patches")}
    try:
        result = subprocess.run([sys.executable, "-m", "specops.compat"], input=json_module.dumps(request),
                                capture_output=True, text=True, env=env, timeout=CELL_TIMEOUT_S * len(cells))
    except subprocess.TimeoutExpired as exc:
        raise AgentError(f"compat: judging {len(cells)} pair(s) took longer than {exc.timeout:g} s") from None
    try:
        return json_module.loads(result.stdout)
    except ValueError:
        last = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
        raise AgentError(f"compat: the analysis subprocess gave no answer: {last}") from None


def requirements(site: Any, name: str) -> list[tuple[str, str]]:
    """(specifier, marker) of each `Requires-Dist: name...` in the unpacked wheel's METADATA."""
    from packaging.requirements import InvalidRequirement, Requirement

    found = []
    for metadata in sorted(site.glob("*.dist-info/METADATA")):
        for line in metadata.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            try:
                requirement = Requirement(line.split(":", 1)[1].strip())
            except InvalidRequirement:
                continue
            if requirement.name.lower().replace("_", "-") == name:
                found.append((str(requirement.specifier), str(requirement.marker or "")))
    return found


def _allows(specifier: str, version: str) -> bool:
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(specifier).contains(version, prereleases=True)


_RELEASES: dict[str, list[str]] = {}


def releases(name: str) -> list[str]:
    """The package's releases on the index, newest first (`pip index versions`), final releases only."""
    import subprocess

    from packaging.version import InvalidVersion, Version

    if name not in _RELEASES:
        result = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name], capture_output=True,
                                text=True, timeout=120)
        line = next((ln for ln in result.stdout.splitlines() if ln.startswith("Available versions:")), None)
        if line is None:
            last = (result.stderr.strip().splitlines() or ["no answer"])[-1]
            raise SpecopsError(f"pip index versions {name}: {last}")
        found = []
        for part in line.split(":", 1)[1].split(","):
            try:
                version = Version(part.strip())
            except InvalidVersion:
                continue
            if not version.is_prerelease:
                found.append(version)
        _RELEASES[name] = [str(v) for v in sorted(found, reverse=True)]
    return _RELEASES[name]


def plan_cell(spec: str, vllm: str, transformers: str | None, spec_site: Any, vllm_site: Any) -> dict[str, Any]:
    """The transformers a cell is judged under, the hs-connectors release it brings, and the pins it breaks."""
    own = [s for s, _m in requirements(spec_site, "transformers")]
    wants_vllm = requirements(spec_site, "vllm")  # speculators < 0.5: vLLM in its own process (the datagen extra)
    pins = [(f"speculators {spec}", s) for s in own if s]
    warnings = []
    if wants_vllm:
        pins += [(f"vLLM {vllm}", s) for s, _m in requirements(vllm_site, "transformers") if s]
        for specifier, _marker in wants_vllm:
            if specifier and not _allows(specifier, vllm):
                warnings.append(f"speculators {spec}'s datagen extra requires vllm{specifier}: pip will not install "
                                f"vLLM {vllm} beside it")
    chosen = transformers
    if chosen is None:
        allowed = [v for v in releases("transformers") if all(_allows(s, v) for _who, s in pins)]
        if not allowed:
            own_only = [v for v in releases("transformers") if all(_allows(s, v) for s in own if s)]
            warnings.append("no transformers release satisfies " + " and ".join(f"{who} ({s})" for who, s in pins)
                            + ": pip cannot install them in one env")
            allowed = own_only
        chosen = allowed[0] if allowed else None
    else:
        warnings += [f"{who} requires transformers{s}: {chosen} is outside it" for who, s in pins
                     if not _allows(s, chosen)]
    hs = [s for s, _m in requirements(spec_site, "hs-connectors") if s.startswith("==")]
    return {"transformers": chosen, "hs_connectors": hs[0][2:] if hs else None, "pins": warnings}


def local_torch() -> str | None:
    """A site holding only a link to this interpreter's torch (found, not imported): base classes to follow."""
    import importlib.util

    from remote import wheel_cache

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = wheel_cache.cache_dir() / "sites" / "local-torch"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "torch"
    target = os.path.realpath(next(iter(spec.submodule_search_locations)))
    if not link.is_symlink() or os.readlink(link) != target:
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    return str(folder)


def _release_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def _error_key(error: dict[str, Any]) -> tuple[str, str]:
    import re

    # the caller's code (stable for one release of it), without what names vLLM's version or its line numbers
    what = error["why"].split(" -> ", 1)[0]
    return error["where"], re.sub(r"[0-9]+", "N", what)


def fixes(cells: list[dict[str, Any]], vllm_versions: list[str]) -> None:
    """Give each error `fixed_by`: the patch sets that patch its file, else the nearest vLLM release of the matrix
    (same speculators and transformers row) where it is gone, else the doctor's own fix."""
    by_cell = {(c["speculators"], c["row_transformers"], c["vllm"]): c for c in cells}
    order = sorted(vllm_versions, key=_release_key)
    for cell in cells:
        for error in cell["error_findings"]:
            if error.get("patch_sets"):
                error["fixed_by"] = "patch set " + ", ".join(error["patch_sets"])
                continue
            if error["check"] == "capability":  # the doctor names the release that brings the capability
                error["fixed_by"] = error["fix"]
                continue
            key = _error_key(error)
            here = order.index(cell["vllm"])
            row = (cell["speculators"], cell["row_transformers"])
            gone = [v for v in order if (other := by_cell.get((*row, v))) is not None
                    and all(_error_key(e) != key for e in other["error_findings"])]
            later = next((v for v in order[here + 1:] if v in gone), None)
            earlier = next((v for v in reversed(order[:here]) if v in gone), None)
            if later is not None:
                error["fixed_by"] = f"vLLM ≥ {later}"
            elif earlier is not None:
                error["fixed_by"] = f"vLLM ≤ {earlier}"
            else:
                error["fixed_by"] = error["fix"] or "none in this matrix"


def cell_fix(cell: dict[str, Any]) -> str:
    """The fixes of a cell's errors, most common first."""
    from collections import Counter

    counted = Counter(e.get("fixed_by", e["fix"]) for e in cell["error_findings"])
    return "; ".join(fix for fix, _n in counted.most_common())


def cell_text(cell: dict[str, Any]) -> str:
    if cell["verdict"] == "ok":
        text = "ok"
    else:
        first = cell["first"]
        reason = first["why"].split(" -> ", 1)[-1]  # what is wrong, not the code it is about
        text = f"{cell['errors']} error(s); first: {first['where'].rsplit('/', 1)[-1]}: {reason[:160]}"
        text += f" [fix: {cell_fix(cell)}]"
    return text


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row_label(spec: str, row: str) -> str:
    return spec if row == DEFAULT_TRANSFORMERS else f"{spec} · transformers {row}"


def markdown_table(document: dict[str, Any]) -> str:
    header = ["speculators \\ vLLM", *document["vllm"]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    by_pair = {(c["speculators"], c["row_transformers"], c["vllm"]): c for c in document["cells"]}
    for spec in document["speculators"]:
        for row in document["transformers"]:
            cells = [by_pair[(spec, row, v)] for v in document["vllm"]]
            lines.append("| " + " | ".join([_row_label(spec, row), *[_md(_short_cell(c)) for c in cells]]) + " |")
    return "\n".join(lines)


def _short_cell(cell: dict[str, Any]) -> str:
    words = "ok" if cell["verdict"] == "ok" else f"**{cell['errors']} error(s)**: {cell_fix(cell)}"
    if cell.get("pins"):
        words += f" (pins: {len(cell['pins'])})"
    return f"{words} · tf {cell['transformers'] or 'none'}"


def markdown_document(document: dict[str, Any], command: str) -> str:
    """COMPAT.md: the table, then every cell's errors with file:line and what fixes each."""
    out = ["# speculators × vLLM: the doctor's stack verdict from released wheels", "",
           f"Generated by `{command}` (`invoke compat --markdown`); do not edit by hand. Each cell is the "
           "doctor's `api`, `capability` and `serving` checks over the released wheels' sources (speculators, the "
           "hs-connectors it pins, transformers, vLLM), nothing imported. `tf`: the transformers release judged "
           "(default: the newest every pin on the speculators env allows). A fix is the patch set in patches/ "
           "that patches the error's file, else the nearest vLLM release of this matrix where the error is gone.",
           "", markdown_table(document), ""]
    for cell in document["cells"]:
        if cell["verdict"] == "ok" and not cell.get("pins"):
            continue
        out.append(f"## speculators {cell['speculators']} × vLLM {cell['vllm']} (transformers "
                   f"{cell['transformers'] or 'none'})")
        out.append("")
        for error in cell["error_findings"]:
            why = error["why"].replace("\n", " ")
            out.append(f"- error ({error['check']}) `{error['where']}`: {_md(why[:400])} — fix: "
                       f"{error.get('fixed_by', error['fix'])}")
        for pin in cell.get("pins", []):
            out.append(f"- pin: {pin}")
        out.append("")
    return "\n".join(out)


@task(iterable=["speculators", "vllm", "transformers"],
      help={"speculators": "speculators release (repeatable or comma-separated; default "
                           f"{','.join(DEFAULT_SPECULATORS)})",
            "vllm": f"vLLM release (repeatable or comma-separated; default {','.join(DEFAULT_VLLM)})",
            "transformers": "transformers release for the speculators env (repeatable or comma-separated; default: "
                            "per cell, the newest the pins allow)",
            "json": "one JSON document on stdout", "markdown": "the table and each cell's errors as Markdown"})
@reports_errors
def compat(c, speculators=None, vllm=None, transformers=None, json=False, markdown=False):
    """Which speculators release works with which vLLM: the doctor's verdict from released sources."""
    from concurrent.futures import ThreadPoolExecutor

    from remote import render, wheel_cache

    as_markdown = markdown
    if json and as_markdown:
        raise BadInput("compat: give --json or --markdown, not both")
    started = time.perf_counter()
    spec_versions = versions("--speculators", speculators, DEFAULT_SPECULATORS)
    vllm_versions = versions("--vllm", vllm, DEFAULT_VLLM)
    given_tf = versions("--transformers", transformers, ()) if transformers else []
    rows = given_tf or [DEFAULT_TRANSFORMERS]
    # fetch and unpack each release once (downloads are the slow part), then judge the cells
    sites = {("speculators", v): wheel_cache.unpacked("speculators", v) for v in spec_versions}
    sites |= {("vllm", v): wheel_cache.unpacked("vllm", v) for v in vllm_versions}
    torch_site = local_torch()
    cells = []
    for s in spec_versions:
        for row in rows:
            for v in vllm_versions:
                plan = plan_cell(s, v, None if row == DEFAULT_TRANSFORMERS else row, sites[("speculators", s)],
                                 sites[("vllm", v)])
                order = [("speculators", s), ("hs-connectors", plan["hs_connectors"]),
                         ("transformers", plan["transformers"])]
                for name, version in order:
                    if version is not None and (name, version) not in sites:
                        sites[(name, version)] = wheel_cache.unpacked(name, version)
                paths = [str(sites[(n, ver)]) for n, ver in order if ver is not None]
                cells.append({"speculators": s, "vllm": v, "transformers": plan["transformers"], "row": row,
                              "pins": plan["pins"],
                              "sites": [*paths, *([torch_site] if torch_site else []), str(sites[("vllm", v)])]})
    workers = max(1, min(len(cells), os.cpu_count() or 1))

    def one(request: dict[str, Any]) -> dict[str, Any]:
        judged = judge([request])["cells"][0]
        return {**judged, "row_transformers": request["row"], "pins": request["pins"]}

    with ThreadPoolExecutor(workers) as pool:
        judged = list(pool.map(one, cells))
    fixes(judged, vllm_versions)
    document = {"ok": True, "speculators": spec_versions, "vllm": vllm_versions, "transformers": rows,
                "cells": judged, "elapsed_s": round(time.perf_counter() - started, 1)}
    if json:
        emit_json(document)
    elif as_markdown:
        argv = ["invoke compat", f"--speculators {','.join(spec_versions)}", f"--vllm {','.join(vllm_versions)}",
                *([f"--transformers {','.join(given_tf)}"] if given_tf else []), "--markdown"]
        print(markdown_document(document, " ".join(argv)))
    else:
        out = render.console()
        view = render.table("speculators × vLLM: the doctor's stack verdict from released sources",
                            ["speculators \\ vLLM", *vllm_versions])
        by_pair = {(c["speculators"], c["row_transformers"], c["vllm"]): c for c in judged}
        for spec in spec_versions:
            for row in rows:
                shown = [by_pair[(spec, row, v)] for v in vllm_versions]
                view.add_row(_row_label(spec, row), *[
                    render.status_text(one["verdict"] == "ok", f"{cell_text(one)} · tf {one['transformers']}")
                    for one in shown])
        out.print(view)
        out.print(f"{len(judged)} cell(s) in {document['elapsed_s']} s")


TASKS = [compat]
