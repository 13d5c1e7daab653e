"""Check 6: the run's packages import. Failures at import time (a pydantic, torch or transformers the
package was not built for) are invisible to static binding, so a child of the host's python imports
them, with a timeout and no GPU visible (`CUDA_VISIBLE_DEVICES=`), and reports the exception and the
deepest frame inside the package's own files. This process never imports them.

The probe starts before the static checks and is read after them: it costs no extra wall time
unless the import is slower than the analysis. `--no-import` skips it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from specops.analysis import ModuleIndex
from specops.doctor._report import Item

PACKAGES = ("speculators",)
TIMEOUT_S = 60.0  # inside the control side's 120 s agent-call limit for the whole doctor

# Runs in the child: {"path": [...], "modules": [...], "roots": {module: [dirs]}} on stdin, one JSON
# line per module on stdout.
_CHILD = r'''
import importlib, json, sys, time, traceback
request = json.load(sys.stdin)
sys.path[:0] = [p for p in request["path"] if p not in sys.path]
for module in request["modules"]:
    began = time.perf_counter()
    try:
        importlib.import_module(module)
        print(json.dumps({"module": module, "ok": True, "seconds": time.perf_counter() - began}), flush=True)
        continue
    except BaseException as exc:
        error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
        frames = traceback.extract_tb(exc.__traceback__)
        cause = exc.__cause__ or exc.__context__
        while cause is not None:  # the frames of a chained cause count too: pydantic re-raises
            frames += traceback.extract_tb(cause.__traceback__)
            cause = cause.__cause__ or cause.__context__
    roots = request["roots"].get(module, [])
    own = [f for f in frames if any(f.filename.startswith(root) for root in roots)]
    frame = own[-1] if own else (frames[-1] if frames else None)
    print(json.dumps({"module": module, "ok": False, "error": error, "seconds": time.perf_counter() - began,
                      "own_frame": bool(own),
                      "frame": frame and {"file": frame.filename, "line": frame.lineno, "function": frame.name,
                                          "code": (frame.line or "").strip()}}), flush=True)
import gc
gc.freeze()  # nothing left to collect that matters: the interpreter's last collections at exit skip it all
'''


@dataclass
class Probe:
    """A running import probe: started with `start`, read with `items`."""

    modules: list[str]
    process: subprocess.Popen | None
    started: float
    timeout: float
    cached: list[dict] | None = None

    def results(self) -> tuple[list[dict], str | None]:
        if self.cached is not None:
            return self.cached, None
        if self.process is None:
            return [], None
        left = max(1.0, self.timeout - (time.perf_counter() - self.started))
        try:
            out, _ = self.process.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            return [], f"import of {', '.join(self.modules)} did not finish within {self.timeout:g} s"
        errors = self.process.stderr_file  # type: ignore[attr-defined]
        errors.seek(0)
        err = errors.read()
        errors.close()
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if not lines and self.process.returncode != 0:
            last = (err.strip().splitlines() or [f"exit status {self.process.returncode}"])[-1]
            return [], f"the import probe gave no answer: {last}"
        return lines, None


def package_roots(index: ModuleIndex, module: str) -> list[str]:
    top = module.split(".")[0]
    return [str(folder) for folder in index.package_dirs(top)] or (
        [str(index.module_file(top))] if index.module_file(top) is not None else [])


def start(index: ModuleIndex, search_path: list[str], modules: tuple[str, ...] = PACKAGES,
          python: str | None = None, timeout: float = TIMEOUT_S) -> Probe:
    wanted = [m for m in modules if index.module_file(m.split(".")[0]) is not None]
    if not wanted:
        return Probe([], None, time.perf_counter(), timeout)
    request = {"path": search_path, "modules": wanted, "roots": {m: package_roots(index, m) for m in wanted}}
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1"}
    # stderr to a file: a chatty import (warnings) must not stall on a full pipe while we analyse
    errors = tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen([python or sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
    process.stderr_file = errors  # type: ignore[attr-defined]
    assert process.stdin is not None
    process.stdin.write(json.dumps(request))
    process.stdin.close()
    process.stdin = None  # communicate() must not touch the closed pipe
    return Probe(wanted, process, time.perf_counter(), timeout)


def items(probe: Probe, versions: dict[str, str | None], remember=None) -> list[Item]:
    results, failure = probe.results()
    if failure:
        return [Item("import", "unknown", ", ".join(probe.modules), failure,
                     "run the doctor with a longer timeout or --no-import")]
    if remember is not None:
        remember(results)
    found = []
    for result in results:
        module = result["module"]
        top = module.split(".")[0]
        if result["ok"]:
            found.append(Item("import", "ok", module, f"import {module} ({top} {versions.get(top) or '?'}) succeeds "
                                                      f"in {result['seconds']:.1f} s with no GPU visible"))
            continue
        frame = result.get("frame") or {}
        where = f"{frame.get('file')}:{frame.get('line')}" if frame else module
        inside = "deepest frame in its own files" if result.get("own_frame") else "last frame (none in its own files)"
        why = (f"import {module} fails: {result['error']}; {inside}: {frame.get('function')} at "
               f"{frame.get('file', '?').rsplit('/', 1)[-1]}:{frame.get('line')}: {frame.get('code')}")
        deps = ", ".join(f"{name} {versions[name]}" for name in ("torch", "transformers") if versions.get(name))
        found.append(Item("import", "error", where, why, f"install the versions {top} "
                          f"{versions.get(top) or ''} was built for (installed: {deps}), or patch the failing line"))
    return found


def cached_probe(modules: list[str], results: list[dict]) -> Probe:
    return Probe(modules, None, time.perf_counter(), 0.0, cached=results)
