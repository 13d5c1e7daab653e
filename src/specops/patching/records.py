"""What the host remembers about an applied set: hashes, versions and the pristine originals.

Layout under <site>/.specops-patches/<set>/, beside the patched distribution in the env's own
site directory: record.json and pristine/<module>.py (byte-exact originals). The record lives with
the env, not with a workdir, because the patched files are the env's: every workdir (and every
user) that drives this env sees the same truth, and a reinstall that replaces the files leaves the
record behind to say "package reinstalled, patch gone". Without the distribution (not installed),
the workdir's state/patches/<set>/ is used. The record is written before the patched file, so a
crash in between leaves a file that still matches the recorded pre-image and reads as "not applied".
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specops.host import atomic, paths


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class SetRecord:
    folder: Path
    document: dict[str, Any]

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        return self.document.setdefault("files", {})

    def pristine_path(self, module: str) -> Path:
        return self.folder / "pristine" / f"{module}.py"

    def pristine(self, module: str) -> bytes | None:
        path = self.pristine_path(module)
        return path.read_bytes() if path.is_file() else None


RECORDS_FOLDER = ".specops-patches"


def set_folder(set_name: str, site: Path | None = None) -> Path:
    """Where a set's record lives: in the patched distribution's site directory when known."""
    # never paths.state_dir() here: reading (status, verify, dry runs) must not create folders
    if site is not None:
        return site / RECORDS_FOLDER / set_name
    return paths.workdir() / "state" / "patches" / set_name


def load(set_name: str, site: Path | None = None) -> SetRecord | None:
    folder = set_folder(set_name, site)
    record = folder / "record.json"
    if not record.is_file():
        return None
    return SetRecord(folder, json.loads(record.read_text()))


def save(record: SetRecord, pristine: dict[str, bytes]) -> None:
    record.folder.mkdir(parents=True, exist_ok=True)
    for module, data in pristine.items():
        target = record.pristine_path(module)
        if not (target.is_file() and target.read_bytes() == data):
            atomic.write_bytes(target, data)
    atomic.write_json(record.folder / "record.json", record.document)


def clear(set_name: str, site: Path | None = None) -> None:
    folder = set_folder(set_name, site)
    (folder / "record.json").unlink(missing_ok=True)
    shutil.rmtree(folder / "pristine", ignore_errors=True)
