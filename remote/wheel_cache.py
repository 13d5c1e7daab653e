"""Released wheels on the workstation: fetched once with `pip download --no-deps` into a cache, and
their Python sources (with the dist-info metadata that names the version) unpacked beside it.

    ~/.cache/specops/wheels/<name>-<version>/<the wheel>.whl      (SPECOPS_WHEEL_CACHE moves it)
    ~/.cache/specops/wheels/sites/<name>-<version>/               (its .py files and dist-info)

The test helpers use the same wheel folders, so a wheel is downloaded once per machine. Both steps
finish in a `.partial` folder that is renamed into place: an interrupted fetch leaves nothing half-done.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from remote.errors import BadInput, SpecopsError

VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z]+[0-9]*)?(\.post[0-9]+)?(\.dev[0-9]+)?$")
KEPT = (".py", ".pyi", "METADATA", "WHEEL", "top_level.txt", "entry_points.txt")
PLATFORMS = ("manylinux_2_35_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "any")


def cache_dir() -> Path:
    root = Path(os.environ.get("SPECOPS_WHEEL_CACHE") or Path.home() / ".cache" / "specops" / "wheels")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _key(name: str, version: str) -> str:
    return f"{name.lower().replace('-', '_')}-{version}"


def check_version(flag: str, version: str) -> str:
    if not VERSION.match(version):
        raise BadInput(f"{flag} {version!r}: not a release version (like 0.16.0)")
    return version


def fetch(name: str, version: str) -> Path:
    """The wheel of name==version, downloaded on first use."""
    folder = cache_dir() / _key(name, version)
    found = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if found:
        return found[0]
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
            "--python-version", "3.12", "-d", str(partial), f"{name}=={version}"]
    for platform in PLATFORMS:
        argv[-1:-1] = ["--platform", platform]
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0 or not sorted(partial.glob("*.whl")):
        shutil.rmtree(partial, ignore_errors=True)
        last = (result.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise SpecopsError(f"pip download {name}=={version}: {last}")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return sorted(folder.glob("*.whl"))[0]


def unpacked(name: str, version: str) -> Path:
    """A folder holding only the wheel's Python sources and metadata: a site directory to analyse."""
    site = cache_dir() / "sites" / _key(name, version)
    if (site / ".unpacked").is_file():
        return site
    wheel = fetch(name, version)
    partial = site.with_name(site.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.endswith(KEPT) and not member.startswith(("/", "..")) and ".." not in member.split("/"):
                archive.extract(member, partial)
    (partial / ".unpacked").write_text(wheel.name + "\n")
    shutil.rmtree(site, ignore_errors=True)
    partial.rename(site)
    return site
