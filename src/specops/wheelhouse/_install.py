"""A bundle's wheels installed into an env of the host: a venv made over the python that holds the
host's torch (`--system-site-packages`), so a vLLM wheel built against that torch finds it, and the
wheels installed with no index and no dependency resolution (the bundle is the whole set)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

STAMP = ".specops-wheelhouse-{name}"
BASE_PTH = "_specops_base_env.pth"


def install(wheels: Path, manifest: dict[str, Any], env: Path, base_python: str | None = None) -> dict[str, Any]:
    """Install the manifest's wheels into `env` (made first if it is not a venv). Idempotent: an env
    stamped with this bundle's digest is left as it is."""
    python = env / "bin" / "python"
    stamp = env / STAMP.format(name=manifest["name"])
    if python.exists() and stamp.exists() and stamp.read_text().strip() == manifest["sha256"]:
        return {"env": str(env), "python": str(python), "installed": False, "reason": "already installed"}
    if not python.exists():
        if env.exists() and any(env.iterdir()):
            raise ValueError(f"{env}: exists and is not a virtual env (no bin/python): name a new folder")
        base = base_python or sys.executable
        if not Path(base).is_file() and shutil.which(base) is None:
            raise ValueError(f"--python {base}: no such interpreter")
        subprocess.run([base, "-m", "venv", "--system-site-packages", str(env)], check=True, capture_output=True,
                       text=True)
        _see_base_venv(base, python)
    files = [str(wheels / wheel["name"]) for wheel in manifest["wheels"]]
    done = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
                           "--disable-pip-version-check", "-q", *files], capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"pip install into {env} failed: {tail[0]}")
    tmp = stamp.with_name(f"{stamp.name}.tmp")
    tmp.write_text(manifest["sha256"] + "\n")
    tmp.replace(stamp)
    return {"env": str(env), "python": str(python), "installed": True, "wheels": len(files)}


def _site_paths(python: str | Path) -> tuple[bool, list[str]]:
    """Whether `python` is itself a venv, and its own site-packages folders."""
    code = ("import json, sys, sysconfig; p = sysconfig.get_paths(); "
            "print(json.dumps([sys.prefix != sys.base_prefix, sorted({p['purelib'], p['platlib']})]))")
    done = subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True)
    is_venv, paths = json.loads(done.stdout)
    return bool(is_venv), list(paths)


def _see_base_venv(base: str, python: Path) -> None:
    """`venv --system-site-packages` shows the base interpreter's site-packages, not those of a venv it was
    made from: where the host's torch lives in a venv (a GPU image's /opt/torch/.venv), a .pth file puts
    that venv's site-packages after the new env's own, so the bundle's wheels come first and torch is seen."""
    is_venv, base_paths = _site_paths(base)
    if not is_venv:
        return
    _, own = _site_paths(python)
    pth = Path(own[0]) / BASE_PTH
    pth.write_text("".join(f"{path}\n" for path in base_paths))
