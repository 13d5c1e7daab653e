"""The one GPU reader of the host side: NVIDIA device nodes (cheap) and nvidia-smi (details).

Standard library only: the doctor, the patcher, the jobs layer and the pipeline all read GPUs here.
- `device_count()`  NVIDIA GPUs from /dev/nvidia<N>: no subprocess, for every step that picks a
                    backend or a launcher (asking torch or nvidia-smi costs seconds).
- `host_kind()`     'gpu' when a GPU is visible to this process (CUDA_VISIBLE_DEVICES honoured), else 'cpu'.
- `read()`          nvidia-smi's rows (index, name, utilisation, memory used/free/total), or why not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

FIELDS = ("index", "name", "utilization.gpu", "memory.used", "memory.free", "memory.total")
TIMEOUT_S = 15


def device_count() -> int:
    """NVIDIA GPUs this host shows, from its device nodes (/dev/nvidia0, /dev/nvidia1, ...)."""
    return sum(1 for node in Path("/dev").glob("nvidia[0-9]*") if node.name[6:].isdigit())


def host_kind() -> str:
    """'gpu' when an NVIDIA GPU is visible to this process, else 'cpu'."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return "cpu"
    driver = Path("/proc/driver/nvidia/gpus")
    if driver.is_dir() and any(driver.iterdir()):
        return "gpu"
    return "gpu" if any(Path("/dev").glob("nvidia[0-9]*")) else "cpu"


def _number(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


class Reading:
    """What nvidia-smi said: `found` False without nvidia-smi; `error` when it failed.

    A plain class, not a dataclass: `job list` reads GPUs on every `invoke status`, and importing
    dataclasses (with inspect) is a measurable part of the agent's start-up."""

    __slots__ = ("error", "found", "gpus")

    def __init__(self, found: bool, gpus: list[dict[str, Any]] | None = None, error: str | None = None) -> None:
        self.found, self.gpus, self.error = found, gpus if gpus is not None else [], error

    def __repr__(self) -> str:
        return f"Reading(found={self.found!r}, gpus={self.gpus!r}, error={self.error!r})"


def read() -> Reading:
    """One row per GPU: index, name, utilization_pct, memory_used_mib, memory_free_mib, memory_total_mib."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return Reading(found=False)
    try:
        result = subprocess.run([smi, f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits"],
                                capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return Reading(found=True, error=f"nvidia-smi: {exc}")
    if result.returncode != 0:
        return Reading(found=True, error=f"nvidia-smi exit {result.returncode}: {result.stderr.strip()[:300]}")
    rows = []
    for line in result.stdout.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(FIELDS):
            continue
        index, name, utilization, used, free, total = cells
        rows.append({"index": _number(index), "name": name, "utilization_pct": _number(utilization),
                     "memory_used_mib": _number(used), "memory_free_mib": _number(free),
                     "memory_total_mib": _number(total)})
    return Reading(found=True, gpus=rows)


def usage() -> dict[str, Any]:
    """{"gpus": [...]} (what `job list` and `check` report); {"gpus": None} without nvidia-smi; plus
    "gpus_error" when it failed."""
    reading = read()
    if not reading.found:
        return {"gpus": None}
    keys = ("index", "name", "utilization_pct", "memory_used_mib", "memory_total_mib")
    document: dict[str, Any] = {"gpus": [{key: row[key] for key in keys} for row in reading.gpus]}
    if reading.error is not None:
        document["gpus_error"] = reading.error
    return document


def smi_count() -> int:
    """GPUs nvidia-smi lists (0 without it, or when it fails)."""
    return len(read().gpus)


def compute_capability() -> int | None:
    """The lowest compute capability of this host's GPUs as vLLM counts it (9.0 -> 90), from nvidia-smi's
    compute_cap; None without GPUs or nvidia-smi (what a quantization method needs is then judged for a CPU)."""
    smi = shutil.which("nvidia-smi")
    if smi is None or device_count() == 0:
        return None
    try:
        result = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                                text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    found = []
    for line in result.stdout.splitlines() if result.returncode == 0 else ():
        major, _, minor = line.strip().partition(".")
        if major.isdigit() and minor.isdigit():
            found.append(int(major) * 10 + int(minor))
    return min(found) if found else None
