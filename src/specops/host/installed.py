"""Installed distributions, read from `*.dist-info` folders on a search path without importing.

Standard library only: the agent must describe a package whose `__init__` cannot even be imported.
The first distribution of a name along the search path wins, as with importlib.metadata.
"""

from __future__ import annotations

import base64
import csv
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path


def normalise(name: str) -> str:
    """PEP 503 normalised project name: 'Speculators_X' -> 'speculators-x'."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class RecordEntry:
    path: str  # relative to the site directory, as written in RECORD
    sha256: str | None  # hex digest, None when RECORD has no hash (e.g. RECORD itself)
    size: int | None


@dataclass
class Distribution:
    name: str
    version: str
    site: Path  # the site directory holding the dist-info
    dist_info: Path
    _record: dict[str, RecordEntry] | None = field(default=None, repr=False)

    def record(self) -> dict[str, RecordEntry]:
        """RECORD rows keyed by path relative to the site directory (posix)."""
        if self._record is None:
            rows: dict[str, RecordEntry] = {}
            record_file = self.dist_info / "RECORD"
            if record_file.exists():
                with record_file.open(newline="") as handle:
                    for row in csv.reader(handle):
                        if not row:
                            continue
                        path, digest, size = [*row, "", ""][:3]
                        sha = None
                        if digest.startswith("sha256="):
                            raw = base64.urlsafe_b64decode(digest[7:] + "=" * (-len(digest[7:]) % 4))
                            sha = raw.hex()
                        rows[path] = RecordEntry(path, sha, int(size) if size.isdigit() else None)
            self._record = rows
        return self._record

    def recorded_sha256(self, file: Path) -> str | None:
        """The sha256 the package's RECORD lists for `file`, None if not listed."""
        try:
            relative = file.resolve().relative_to(self.site.resolve()).as_posix()
        except ValueError:
            return None
        entry = self.record().get(relative)
        return entry.sha256 if entry else None


def _read_metadata(dist_info: Path) -> tuple[str, str] | None:
    metadata = dist_info / "METADATA"
    if not metadata.exists():
        metadata = dist_info / "PKG-INFO"
    if not metadata.exists():
        return None
    # Only Name and Version are needed, and they lead the header block: read no further (an email
    # parser over every METADATA on the path costs tens of milliseconds per agent call).
    name = version = None
    with metadata.open(errors="replace") as handle:
        for line in handle:
            if not line.strip():
                break
            key, _, value = line.partition(":")
            if key == "Name":
                name = value.strip()
            elif key == "Version":
                version = value.strip()
            if name and version:
                return name, version
    return None


def distributions(search_path: list[str] | None = None) -> dict[str, Distribution]:
    """Every distribution visible on the search path (default: this interpreter's sys.path)."""
    found: dict[str, Distribution] = {}
    for entry in search_path if search_path is not None else sys.path:
        site = Path(entry or ".")
        if not site.is_dir():
            continue
        for dist_info in sorted(site.glob("*.dist-info")) + sorted(site.glob("*.egg-info")):
            meta = _read_metadata(dist_info) if dist_info.is_dir() else None
            if meta is None:
                continue
            key = normalise(meta[0])
            found.setdefault(key, Distribution(meta[0], meta[1], site, dist_info))
    return found


def version_of(name: str, search_path: list[str] | None = None) -> str | None:
    dist = distributions(search_path).get(normalise(name))
    return dist.version if dist else None
