"""Atomic, durable writes: temp file in the same directory, fsync, rename, fsync the directory.

Whole folders the same way (`replace_folder`): built in a staging folder beside the target,
fsynced, then swapped in.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_bytes(path: str | os.PathLike[str], data: bytes, mode: int | None = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def write_text(path: str | os.PathLike[str], text: str, mode: int | None = None) -> None:
    write_bytes(path, text.encode(), mode)


def write_json(path: str | os.PathLike[str], document: Any) -> None:
    write_text(path, json.dumps(document, indent=2, sort_keys=True, default=str) + "\n")


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
