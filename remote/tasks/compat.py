"""Task: `compat` — the compatibility matrix of released speculators × vLLM versions, on the workstation.

Each version's wheel is fetched with `pip download --no-deps` into a cache and only its Python sources
are unpacked (remote/wheel_cache.py); each pair is judged by the doctor's static stack checks (the API
of speculators into vLLM: calls, instances, engine loop, moved names) in a local python subprocess
running the agent's own code, so nothing is imported here and no GPU host is needed.
"""

from __future__ import annotations

import json as json_module
import os
import sys
import time
from typing import Any

from invoke import task

from remote.errors import AgentError, BadInput
from remote.session import emit_json, reports_errors

# wheel_cache (zipfile, shutil), the inventory, concurrent.futures and rich load inside the task:
# every other task starts without them.

DEFAULT_SPECULATORS = ("0.3.0", "0.4.0.1", "0.9.0")
DEFAULT_VLLM = ("0.16.0", "0.33.0")
CELL_TIMEOUT_S = 900


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


def cell_text(cell: dict[str, Any]) -> str:
    if cell["verdict"] == "ok":
        text = "ok"
    else:
        first = cell["first"]
        reason = first["why"].split(" -> ", 1)[-1]  # what is wrong, not the code it is about
        text = f"{cell['errors']} error(s); first: {first['where'].rsplit('/', 1)[-1]}: {reason[:240]}"
    if cell["verdict"] != "ok":  # for a clean pair, sets that fit it fix other things (CPU hosts, speed)
        covered = [c["name"] for c in cell.get("covered_by", []) if "error" not in c]
        text += f" [patch set: {', '.join(covered)}]" if covered else " [no patch set]"
    return text


def markdown_table(document: dict[str, Any]) -> str:
    header = ["speculators \\ vLLM", *document["vllm"]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    by_pair = {(c["speculators"], c["vllm"]): c for c in document["cells"]}
    for spec in document["speculators"]:
        row = [spec] + [cell_text(by_pair[(spec, v)]).replace("|", "\\|") for v in document["vllm"]]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


@task(iterable=["speculators", "vllm"],
      help={"speculators": "speculators release (repeatable or comma-separated; default "
                           f"{','.join(DEFAULT_SPECULATORS)})",
            "vllm": f"vLLM release (repeatable or comma-separated; default {','.join(DEFAULT_VLLM)})",
            "json": "one JSON document on stdout", "markdown": "the table as Markdown on stdout"})
@reports_errors
def compat(c, speculators=None, vllm=None, json=False, markdown=False):
    """Which speculators release works with which vLLM: the doctor's verdict from released sources."""
    from concurrent.futures import ThreadPoolExecutor

    from remote import render, wheel_cache

    as_markdown = markdown
    if json and as_markdown:
        raise BadInput("compat: give --json or --markdown, not both")
    started = time.perf_counter()
    spec_versions = versions("--speculators", speculators, DEFAULT_SPECULATORS)
    vllm_versions = versions("--vllm", vllm, DEFAULT_VLLM)
    # fetch and unpack each release once (downloads are the slow part), then judge the pairs
    sites = {("speculators", v): wheel_cache.unpacked("speculators", v) for v in spec_versions}
    sites |= {("vllm", v): wheel_cache.unpacked("vllm", v) for v in vllm_versions}
    cells = [{"speculators": s, "vllm": v, "sites": [str(sites[("speculators", s)]), str(sites[("vllm", v)])]}
             for s in spec_versions for v in vllm_versions]
    workers = max(1, min(len(cells), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        judged = list(pool.map(lambda one: judge([one])["cells"][0], cells))
    document = {"ok": True, "speculators": spec_versions, "vllm": vllm_versions, "cells": judged,
                "elapsed_s": round(time.perf_counter() - started, 1)}
    if json:
        emit_json(document)
    elif as_markdown:
        print(markdown_table(document))
    else:
        out = render.console()
        view = render.table("speculators × vLLM: the doctor's API verdict from released sources",
                            ["speculators \\ vLLM", *vllm_versions])
        by_pair = {(c["speculators"], c["vllm"]): c for c in judged}
        for spec in spec_versions:
            view.add_row(spec, *[render.status_text(by_pair[(spec, v)]["verdict"] == "ok",
                                                    cell_text(by_pair[(spec, v)])) for v in vllm_versions])
        out.print(view)
        out.print(f"{len(judged)} pair(s) in {document['elapsed_s']} s")


TASKS = [compat]
