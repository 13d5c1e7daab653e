"""What the host remembers about an applied set: hashes, versions and the pristine originals.

Layout under state/patches/<set>/: record.json and pristine/<module>.py (byte-exact originals).
The record is written before the patched file, so a crash in between leaves a file that still
matches the recorded pre-image and reads as "not applied".
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specops import atomic, paths


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


def set_folder(set_name: str) -> Path:
    # not paths.state_dir(): reading (status, verify, dry runs) must not create folders
    return paths.workdir() / "state" / "patches" / set_name


def load(set_name: str) -> SetRecord | None:
    folder = set_folder(set_name)
    record = folder / "record.json"
    if not record.is_file():
        return None
    return SetRecord(folder, json.loads(record.read_text()))


def save(record: SetRecord, pristine: dict[str, bytes]) -> None:
    paths.state_dir("patches", record.folder.name)
    for module, data in pristine.items():
        target = record.pristine_path(module)
        if not (target.is_file() and target.read_bytes() == data):
            atomic.write_bytes(target, data)
    atomic.write_json(record.folder / "record.json", record.document)


def clear(set_name: str) -> None:
    folder = set_folder(set_name)
    (folder / "record.json").unlink(missing_ok=True)
    shutil.rmtree(folder / "pristine", ignore_errors=True)
