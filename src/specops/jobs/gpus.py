"""GPU utilisation and memory from nvidia-smi, when the host has it."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

_FIELDS = ("index", "name", "utilization.gpu", "memory.used", "memory.total")
_TIMEOUT_S = 15


def _number(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def gpu_usage() -> dict[str, Any]:
    """{"gpus": [...]} with one entry per GPU; {"gpus": None} without nvidia-smi; plus "error"."""
    if shutil.which("nvidia-smi") is None:
        return {"gpus": None}
    try:
        result = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(_FIELDS)}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"gpus": [], "gpus_error": f"nvidia-smi: {exc}"}
    if result.returncode != 0:
        return {"gpus": [], "gpus_error": f"nvidia-smi exit {result.returncode}: {result.stderr.strip()[:300]}"}
    gpus = []
    for line in result.stdout.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(_FIELDS):
            continue
        index, name, utilization, used, total = cells
        gpus.append({"index": _number(index), "name": name, "utilization_pct": _number(utilization),
                     "memory_used_mib": _number(used), "memory_total_mib": _number(total)})
    return {"gpus": gpus}
