"""Patch sets on disk: `patches/<package>-<range>/set.toml` plus one TOML file per patch.

Parsing is strict: an unknown key, a wrong type, an empty or no-op replacement, a bad version
specifier or a duplicate id is BadInput naming the file and the key (see patches/README.md).
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specops.contract.errors import BadInput
from specops.contract.protocol import name_problem
from specops.patching.specifiers import InvalidVersion, SpecifierSet

SET_FILE = "set.toml"
HOSTS = ("any", "cpu", "gpu")
FILE_CHECKS = ("parses", "calls_bind", "imports_resolve")
_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclass(frozen=True)
class Replacement:
    old: str
    new: str
    count: int


@dataclass(frozen=True)
class Patch:
    id: str
    reason: str
    module: str
    checks: tuple[str, ...]
    replacements: tuple[Replacement, ...]
    source: Path  # the patch file
    digest: str  # sha256 of the patch file, to notice a spec edited after apply


@dataclass(frozen=True)
class PatchSet:
    name: str  # folder name
    folder: Path
    package: str
    version: SpecifierSet
    host: str
    description: str
    requires: dict[str, SpecifierSet]
    patches: tuple[Patch, ...]

    def modules(self) -> list[str]:
        """Target modules in first-patch order."""
        return list(dict.fromkeys(patch.module for patch in self.patches))

    def patches_for(self, module: str) -> list[Patch]:
        return [patch for patch in self.patches if patch.module == module]


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{path}: not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read: {exc}") from None


def _take(document: dict[str, Any], path: Path, key: str, kind: type, *, required: bool = True,
          default: Any = None, where: str = "") -> Any:
    label = f"{where}{key}"
    if key not in document:
        if required:
            raise BadInput(f"{path}: key '{label}' is missing")
        return default
    value = document[key]
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise BadInput(f"{path}: key '{label}' must be a {kind.__name__}, got {type(value).__name__}")
    return value


def _no_unknown(document: dict[str, Any], path: Path, allowed: set[str], where: str = "") -> None:
    unknown = sorted(set(document) - allowed)
    if unknown:
        raise BadInput(f"{path}: unknown key '{where}{unknown[0]}' (allowed: {', '.join(sorted(allowed))})")


def _specifier(text: str, path: Path, key: str) -> SpecifierSet:
    try:
        return SpecifierSet.parse(text)
    except (ValueError, InvalidVersion) as exc:
        raise BadInput(f"{path}: key '{key}': {exc}") from None


def load_patch(path: Path) -> Patch:
    raw = path.read_bytes() if path.exists() else b""
    document = _load_toml(path)
    _no_unknown(document, path, {"id", "reason", "module", "checks", "replace"})
    patch_id = _take(document, path, "id", str)
    if not _ID.match(patch_id):
        raise BadInput(f"{path}: key 'id': {patch_id!r} is not lower-case letters, digits, '.', '-', '_'")
    reason = _take(document, path, "reason", str).strip()
    if not reason or "\n" in reason:
        raise BadInput(f"{path}: key 'reason' must be one non-empty line")
    module = _take(document, path, "module", str)
    if not _MODULE.match(module):
        raise BadInput(f"{path}: key 'module': {module!r} is not a dotted module name")
    checks = _take(document, path, "checks", list, required=False, default=list(FILE_CHECKS))
    for check in checks:
        if check not in FILE_CHECKS:
            raise BadInput(f"{path}: key 'checks': unknown check {check!r} (known: {', '.join(FILE_CHECKS)})")
    blocks = _take(document, path, "replace", list)
    if not blocks:
        raise BadInput(f"{path}: key 'replace' needs at least one [[replace]] block")
    replacements = []
    for number, block in enumerate(blocks, 1):
        where = f"replace[{number}]."
        if not isinstance(block, dict):
            raise BadInput(f"{path}: key 'replace' must be [[replace]] tables")
        _no_unknown(block, path, {"old", "new", "count"}, where)
        old = _take(block, path, "old", str, where=where)
        new = _take(block, path, "new", str, where=where)
        count = _take(block, path, "count", int, required=False, default=1, where=where)
        if not old:
            raise BadInput(f"{path}: key '{where}old' is empty")
        if old == new:
            raise BadInput(f"{path}: key '{where}new' equals 'old': the replacement changes nothing")
        if count < 1:
            raise BadInput(f"{path}: key '{where}count' must be at least 1, got {count}")
        replacements.append(Replacement(old, new, count))
    return Patch(patch_id, reason, module, tuple(checks), tuple(replacements), path,
                 hashlib.sha256(raw).hexdigest())


def load_set(folder: Path) -> PatchSet:
    path = folder / SET_FILE
    if not path.is_file():
        raise BadInput(f"{path}: missing (every patch set folder needs a {SET_FILE})")
    document = _load_toml(path)
    _no_unknown(document, path, {"package", "version", "host", "description", "requires"})
    package = _take(document, path, "package", str)
    version = _specifier(_take(document, path, "version", str), path, "version")
    host = _take(document, path, "host", str, required=False, default="any")
    if host not in HOSTS:
        raise BadInput(f"{path}: key 'host' must be one of {', '.join(HOSTS)}, got {host!r}")
    description = _take(document, path, "description", str, required=False, default="")
    requires_table = _take(document, path, "requires", dict, required=False, default={})
    requires = {}
    for name, text in requires_table.items():
        if not isinstance(text, str):
            raise BadInput(f"{path}: key 'requires.{name}' must be a str, got {type(text).__name__}")
        requires[name] = _specifier(text, path, f"requires.{name}")
    patches = [load_patch(file) for file in sorted(folder.glob("*.toml")) if file.name != SET_FILE]
    if not patches:
        raise BadInput(f"{folder}: patch set has no patch files (*.toml besides {SET_FILE})")
    seen: dict[str, Path] = {}
    for patch in patches:
        if patch.id in seen:
            raise BadInput(f"{patch.source}: key 'id': duplicate id {patch.id!r} (also in {seen[patch.id].name})")
        seen[patch.id] = patch.source
    return PatchSet(folder.name, folder, package, version, host, description, requires, tuple(patches))


def load_sets(patches_dir: Path, names: list[str] | None = None) -> list[PatchSet]:
    """Named sets (in the order given) or every set under patches_dir (sorted by name)."""
    for name in names or []:
        problem = name_problem(name)  # a set's name is a folder under patches/
        if problem is not None:
            raise BadInput(f"--set: {problem}")
    if not patches_dir.is_dir():
        raise BadInput(f"{patches_dir}: patches directory does not exist")
    available = sorted(p.name for p in patches_dir.iterdir() if (p / SET_FILE).is_file())
    if names:
        for name in names:
            if name not in available:
                raise BadInput(f"--set {name}: no patch set named {name!r} in {patches_dir} "
                               f"(have: {', '.join(available) or 'none'})")
        chosen = list(dict.fromkeys(names))
    else:
        chosen = available
    return [load_set(patches_dir / name) for name in chosen]
