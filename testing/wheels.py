"""Real third-party wheels for patch and API tests, fetched once into a cache outside the repo.

`pip download --no-deps` brings the wheel from PyPI into SPECOPS_WHEEL_CACHE (default
~/.cache/specops/wheels); `site_with(...)` unpacks the pure-Python parts (sources and
dist-info, no compiled extensions) of one or more wheels into a throwaway site directory, which
then looks to specops exactly like an installed environment's site-packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL_SUFFIXES = (".py", ".pyi", "METADATA", "RECORD", "WHEEL", "top_level.txt", "entry_points.txt")


def cache_dir() -> Path:
    root = Path(os.environ.get("SPECOPS_WHEEL_CACHE", Path.home() / ".cache" / "specops" / "wheels"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _normalise(name: str) -> str:
    return name.lower().replace("-", "_")


def fetch_wheel(name: str, version: str) -> Path:
    """Path of the wheel for name==version, downloading it on first use."""
    folder = cache_dir() / f"{_normalise(name)}-{version}"
    found = sorted(folder.glob("*.whl")) if folder.exists() else []
    if found:
        return found[0]
    partial = folder.with_suffix(".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
         "--python-version", "3.12", "--platform", "manylinux_2_28_x86_64",
         "--platform", "manylinux_2_31_x86_64", "--platform", "manylinux_2_17_x86_64",
         "--platform", "manylinux2014_x86_64",
         "--platform", "any", "-d", str(partial), f"{name}=={version}"],
        check=True,
    )
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return sorted(folder.glob("*.whl"))[0]


def unpack_into(wheel: Path, site: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.endswith(WHEEL_SUFFIXES):
                archive.extract(member, site)


def site_with(site: Path, *packages: tuple[str, str]) -> Path:
    """Unpack each (name, version) wheel's Python parts into `site`; returns `site`."""
    site.mkdir(parents=True, exist_ok=True)
    for name, version in packages:
        unpack_into(fetch_wheel(name, version), site)
    return site


_PYTHON_WITH_SITE = """#!/bin/sh
PYTHONPATH='{site}'${{PYTHONPATH:+:$PYTHONPATH}} exec '{python}' "$@"
"""


def python_with(root: Path, *packages: tuple[str, str]) -> Path:
    """An interpreter script at root/site-python: this python with the wheels' site (root/site) first on
    its path — a host env that holds released packages the checkout's venv may lack."""
    site = site_with(root / "site", *packages)
    python = root / "site-python"
    python.write_text(_PYTHON_WITH_SITE.format(site=site, python=sys.executable))
    python.chmod(0o755)
    return python
