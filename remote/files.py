"""Durable local writes of the control side: a staged folder swapped into place, fsynced."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def swap_folder(staging: Path, destination: Path) -> None:
    """Make the complete `staging` folder `destination`: its files and folders fsynced first, then renamed
    over the old one (kept aside as a sibling until the new one is in place), then the parent fsynced.

    `staging` must be a sibling of `destination` (same filesystem: the renames are atomic). A crash
    leaves the old folder, the new one, or the old one beside the new one: never a mixed folder.
    """
    for folder, _dirs, files in os.walk(staging, topdown=False):
        for name in files:
            _fsync(Path(folder) / name)
        _fsync(Path(folder))
    previous = destination.with_name(f".{destination.name}.previous")
    shutil.rmtree(previous, ignore_errors=True)
    if destination.exists():
        destination.rename(previous)
    staging.rename(destination)
    _fsync(destination.parent)
    shutil.rmtree(previous, ignore_errors=True)
