"""Whole-folder writes: build in a staging folder beside the target, fsync, then swap it in."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from specops import atomic


def replace_folder(target: Path, build: Callable[[Path], None]) -> None:
    """Run build(staging) and put the result at target; a failure leaves target as it was."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    old = target.with_name(f".{target.name}.old")
    try:
        build(staging)
        staging.chmod(0o755)
        for file in staging.rglob("*"):
            if file.is_file():
                file.chmod(0o644)
                with file.open("rb") as handle:
                    os.fsync(handle.fileno())
        shutil.rmtree(old, ignore_errors=True)
        if target.exists():
            target.rename(old)
        staging.rename(target)
        shutil.rmtree(old, ignore_errors=True)
        atomic.fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
