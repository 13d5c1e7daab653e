"""`--deep`: bind calls against the real callees, imported in a subprocess of the host's python.

The static pass says which callee each call reaches (`Finding.callee`) and how the call passes its
arguments (`Finding.shape`). Here a child interpreter imports the module that makes the calls, imports
each callee by its dotted name and binds placeholder objects with `inspect.signature(...).bind`. This
process never imports what it inspects; only the child does, and it may take its time (vLLM) or fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

from specops.analysis._checks import Finding

# Runs in the child. Reads {"module", "calls": [{"callee", "positional", "keywords", "star_args",
# "star_kwargs"}]} on stdin; prints {"module_error", "results": [[status, detail], ...]}.
_CHILD = r'''
import importlib, inspect, json, sys

request = json.load(sys.stdin)


def failure(exc):
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def load(qualname):
    parts = qualname.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            value = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # no such module: the rest are attributes of a shorter prefix
                continue
            raise
        for attr in parts[cut:]:
            value = getattr(value, attr)
        return value
    raise ModuleNotFoundError(f"no module {parts[0]}", name=parts[0])


def bind(call):
    try:
        callee = load(call["callee"])
    except Exception as exc:
        return "unknown", f"could not import {call['callee']}: {failure(exc)}"
    try:
        signature = inspect.signature(callee)
    except (TypeError, ValueError) as exc:
        return "unknown", f"no signature for {call['callee']}: {failure(exc)}"
    args = [object()] * call["positional"]
    kwargs = {name: object() for name in call["keywords"]}
    starred = call["star_args"] or call["star_kwargs"]
    try:
        (signature.bind_partial if starred else signature.bind)(*args, **kwargs)
    except TypeError as exc:
        return "error", f"{exc} (live signature {call['callee']}{signature})"
    if starred:
        return "unknown", f"binds so far, but *args/**kwargs are not known (live signature {signature})"
    return "ok", f"binds live: {call['callee']}{signature}"


try:
    importlib.import_module(request["module"])
    module_error = None
except BaseException as exc:  # SystemExit and the like from a package's import-time checks count too
    module_error = failure(exc)
results = []
for call in request["calls"]:
    if module_error is not None:
        results.append(["unknown", f"import {request['module']} failed: {module_error}"])
    else:
        results.append(list(bind(call)))
print(json.dumps({"module_error": module_error, "results": results}))
'''


def bind_live(module: str, calls: list[Finding], *, python: str | None = None, timeout: float = 300.0
              ) -> tuple[str | None, list[Finding]]:
    """(why `import module` failed or None, one live Finding per call). Calls the static pass did not
    resolve to a callee, and any call when the child fails or times out, come back "unknown"."""
    wanted = [c for c in calls if c.callee and c.shape is not None]
    request = {"module": module, "calls": [{"callee": c.callee, **c.shape.to_dict()} for c in wanted]}
    try:
        result = subprocess.run([python or sys.executable, "-c", _CHILD], input=json.dumps(request),
                                capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        reason = f"import {module} and binding did not finish within {timeout:g} s"
        return reason, [replace(c, status="unknown", detail=reason) for c in calls]
    try:
        answer = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        last = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
        reason = f"the import subprocess for {module} gave no answer: {last}"
        return reason, [replace(c, status="unknown", detail=reason) for c in calls]
    live = dict(zip((id(c) for c in wanted), answer["results"], strict=True))
    findings = []
    for call in calls:
        status, detail = live.get(id(call), ("unknown", "the static pass resolved no callee to import"))
        findings.append(replace(call, status=status, detail=detail))
    return answer["module_error"], findings
