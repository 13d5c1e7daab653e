"""A result cache for analyses, keyed by what they read: each file by content hash, each folder by its
listing. Standard library only; written atomically; safe to delete at any time (it is rebuilt).

An entry holds the result and the evidence: {path: [size, mtime_ns, sha256]} for every file the
analysis read and {folder: hash of names} for every folder it listed (a module that appears or
disappears changes what an import resolves to). A file whose size and mtime are unchanged is taken
as unchanged; otherwise its content is hashed again, so a touched-but-same file still hits.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from specops.host import atomic

FORMAT = 1
CODE = Path(__file__).resolve().parents[1]  # specops/: the analysis code is part of every key


def cache_root() -> Path:
    configured = os.environ.get("SPECOPS_ANALYSIS_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "specops" / "analysis"


def file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


@functools.cache
def code_version() -> str:
    """Hash of the agent's own analysis and doctor sources, and of every file of the pipeline the doctor checks
    too: new code never reads old results. Their place is not part of it (see `relocatable`)."""
    digest = hashlib.sha256()
    for folder in ("analysis", "doctor", "pipeline"):
        for path in sorted((CODE / folder).rglob("*.py")):
            digest.update(path.relative_to(CODE).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


OWN = "<specops>"  # the agent's own code folder in a stored result: every workdir's copy of the agent reads the same


def relocatable(value: Any) -> Any:
    """A result as stored: the paths of the agent's own files (specops/, wherever this copy lives: a host's workdir,
    a test's temporary one) written relative to it, so that a workdir holding the same code reads its own paths."""
    return json.loads(json.dumps(value).replace(json.dumps(str(CODE))[1:-1], OWN))


def located(value: Any) -> Any:
    """A stored result with the agent's own files at this copy's place."""
    return json.loads(json.dumps(value).replace(OWN, json.dumps(str(CODE))[1:-1]))


def key_of(*parts: Any) -> str:
    text = json.dumps([FORMAT, code_version(), *parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _listing_hash(names: Any) -> str:
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


def evidence(files: list[Path], folders: dict[Path, Any]) -> dict[str, Any]:
    recorded: dict[str, list] = {}
    for path in files:
        try:
            stat = path.stat()
        except OSError:
            continue
        digest = file_sha256(path)
        if digest is not None:
            recorded[str(path)] = [stat.st_size, stat.st_mtime_ns, digest]
    return {"files": recorded, "folders": {str(folder): _listing_hash(names) for folder, names in folders.items()}}


def still_true(proof: dict[str, Any]) -> bool:
    for name, (size, mtime, digest) in proof.get("files", {}).items():
        path = Path(name)
        try:
            stat = path.stat()
        except OSError:
            return False
        if (stat.st_size, stat.st_mtime_ns) != (size, mtime) and file_sha256(path) != digest:
            return False
    for name, listing in proof.get("folders", {}).items():
        try:
            names = os.listdir(name)
        except OSError:
            names = []
        if _listing_hash(names) != listing:
            return False
    return True


def load(key: str) -> Any | None:
    path = cache_root() / f"{key}.json"
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or not still_true(entry.get("proof", {})):
        return None
    return entry.get("value")


def store(key: str, value: Any, proof: dict[str, Any]) -> None:
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        atomic.write_json(root / f"{key}.json", {"format": FORMAT, "proof": proof, "value": value})
    except OSError:
        pass  # a cache that cannot be written only costs time


def _own(path: Path) -> bool:
    """A file or folder of the agent's own code: its content is in every key (code_version), its place in no entry."""
    return path == CODE or CODE in path.parents


def index_evidence(index: Any) -> dict[str, Any]:
    """What a ModuleIndex has read so far: its files and its folder listings (not the agent's own: see _own)."""
    files = [path for path, text in index._texts.items() if text is not None and not _own(path)]
    # the folders it listed to resolve modules, and those of every file it read: a package walked
    # whole (check_package) changes when a file is added beside the ones it read
    folders = {folder: names for folder, names in index._listings.items() if not _own(folder)}
    for path in files:
        if path.parent not in folders:
            try:
                folders[path.parent] = os.listdir(path.parent)
            except OSError:
                folders[path.parent] = []
    return evidence(files, folders)


__all__ = ["cache_root", "code_version", "evidence", "index_evidence", "key_of", "load", "located", "relocatable",
           "still_true", "store"]
