"""Wheels carried to a host without internet: packed into one compressed stream, cut into parts that
each fit whatever carries them, every part and the whole checked by sha256 on arrival.

A bundle folder holds `manifest.json` and `NAME.tar.xz.000`, `.001`, ...: the tar holds the wheels.
Parts arrive in any order over any number of transfers; `assemble` says which are still missing or
damaged (so only those are sent again) and unpacks nothing until every part checks. Wheels may be
trimmed on the way in (`drop`: members a host does not need, such as another GPU generation's
kernels); a trimmed wheel is rewritten with its RECORD updated. Members are stored uncompressed
inside the rewritten wheels so that the bundle's one xz stream compresses across them.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import io
import json
import lzma
import os
import shutil
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

MANIFEST = "manifest.json"
FORMAT = 1
CHUNK = 1 << 20


@dataclass(frozen=True)
class Drop:
    """Members of one distribution's wheel left out: `vllm:vllm/vllm_flash_attn/_vllm_fa2_C*`."""

    distribution: str
    pattern: str

    @classmethod
    def parse(cls, text: str) -> Drop:
        distribution, sep, pattern = text.partition(":")
        if not sep or not distribution or not pattern:
            raise ValueError(f"--drop {text!r}: expected DISTRIBUTION:GLOB (e.g. vllm:vllm/vllm-rs)")
        return cls(_normal(distribution), pattern)


def _normal(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def wheel_distribution(path: Path) -> str:
    """The distribution a wheel file is of, from its name (PEP 427: NAME-VERSION-...whl)."""
    if path.suffix != ".whl" or path.name.count("-") < 4:
        raise ValueError(f"{path}: not a wheel file name (NAME-VERSION-PY-ABI-PLATFORM.whl)")
    return _normal(path.name.split("-", 1)[0])


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def rewrite_wheel(source: Path, target: Path, patterns: list[str]) -> list[str]:
    """Copy a wheel with every member stored (no deflate), leaving out members matching `patterns`;
    RECORD is rewritten to list what is left. Returns the names left out."""
    dropped: list[str] = []
    with zipfile.ZipFile(source) as wheel:
        names = wheel.namelist()
        record_name = next((n for n in names if n.endswith(".dist-info/RECORD")), None)
        kept = [n for n in names if not any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        dropped = [n for n in names if n not in kept]
        with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED) as out:
            record_lines: list[str] = []
            for name in kept:
                if name == record_name:
                    continue
                info = wheel.getinfo(name)
                data = wheel.read(name)
                stored = zipfile.ZipInfo(name, date_time=info.date_time)
                stored.external_attr = info.external_attr
                stored.compress_type = zipfile.ZIP_STORED
                out.writestr(stored, data)
                if not name.endswith("/"):
                    record_lines.append(f"{name},{_record_hash(data)},{len(data)}")
            if record_name:
                record_lines.append(f"{record_name},,")
                out.writestr(zipfile.ZipInfo(record_name, date_time=(2020, 1, 1, 0, 0, 0)),
                             "\n".join(record_lines) + "\n")
    return dropped


class _PartWriter(io.RawIOBase):
    """A write-only stream cut into files of at most `part_bytes`, each hashed as it is written."""

    def __init__(self, folder: Path, stem: str, part_bytes: int) -> None:
        self.folder, self.stem, self.part_bytes = folder, stem, part_bytes
        self.parts: list[dict[str, Any]] = []
        self.whole = hashlib.sha256()
        self.total = 0
        self._handle: IO[bytes] | None = None
        self._digest = hashlib.sha256()
        self._written = 0

    def writable(self) -> bool:
        return True

    def _close_part(self) -> None:
        if self._handle is not None:
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()
            self.parts[-1].update(bytes=self._written, sha256=self._digest.hexdigest())
            self._handle = None

    def _open_part(self) -> None:
        name = f"{self.stem}.{len(self.parts):03d}"
        self.parts.append({"name": name})
        self._handle = open(self.folder / name, "wb")
        self._digest, self._written = hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            if self._handle is None or self._written >= self.part_bytes:
                self._close_part()
                self._open_part()
            assert self._handle is not None
            take = min(len(view) - done, self.part_bytes - self._written)
            block = view[done:done + take]
            self._handle.write(block)
            self._digest.update(block)
            self.whole.update(block)
            self._written += take
            self.total += take
            done += take
        return done

    def close(self) -> None:
        self._close_part()
        super().close()


def pack(wheels: Iterable[Path], out: Path, name: str, part_bytes: int, drops: Iterable[Drop] = (),
         preset: int = 9 | lzma.PRESET_EXTREME) -> dict[str, Any]:
    """Pack `wheels` into `out` (a new or empty folder): parts of at most `part_bytes`, manifest last,
    so a folder with a manifest is a finished bundle."""
    wheels = sorted(Path(w) for w in wheels)
    if not wheels:
        raise ValueError("no wheels to pack")
    if part_bytes < 1024:
        raise ValueError(f"part size {part_bytes} bytes: at least 1 KiB")
    by_distribution: dict[str, list[str]] = {}
    for drop in drops:
        by_distribution.setdefault(drop.distribution, []).append(drop.pattern)
    for wheel in wheels:
        by_distribution.pop(wheel_distribution(wheel), None)
    if by_distribution:
        raise ValueError(f"--drop names {sorted(by_distribution)}: no such wheel among those packed")
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise ValueError(f"{out}: not empty (a bundle is packed into a new folder)")
    patterns = {}
    for drop in drops:
        patterns.setdefault(drop.distribution, []).append(drop.pattern)
    writer = _PartWriter(out, f"{name}.tar.xz", part_bytes)
    try:
        entries = _write_parts(wheels, writer, out, patterns, preset)
    except BaseException:  # nothing half-written: a folder without its manifest keeps no parts either
        writer.close()
        for part in writer.parts:
            (out / part["name"]).unlink(missing_ok=True)
        raise
    manifest = {"format": FORMAT, "name": name, "part_bytes": part_bytes, "parts": writer.parts,
                "bytes": writer.total, "sha256": writer.whole.hexdigest(), "wheels": entries}
    _write_json(out / MANIFEST, manifest)
    return manifest


def _write_parts(wheels: list[Path], writer: _PartWriter, out: Path, patterns: dict[str, list[str]],
                 preset: int) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix=".pack-", dir=out) as scratch:
        with lzma.open(writer, "wb", preset=preset) as xz, tarfile.open(fileobj=xz, mode="w|") as tar:
            for wheel in wheels:
                rewritten = Path(scratch) / wheel.name
                try:
                    dropped = rewrite_wheel(wheel, rewritten, patterns.get(wheel_distribution(wheel), []))
                except zipfile.BadZipFile:
                    raise ValueError(f"{wheel}: not a wheel (not a zip archive)") from None
                entries.append({"name": wheel.name, "sha256": sha256_file(rewritten),
                                "bytes": rewritten.stat().st_size, "source_sha256": sha256_file(wheel),
                                "dropped": dropped})
                tar.add(rewritten, arcname=wheel.name)
                rewritten.unlink()
        writer.close()
    return entries


def _write_json(path: Path, document: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(tmp, path)


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no manifest (not a bundle folder, or its packing did not finish)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format: expected {FORMAT}, found {manifest.get('format')!r}"
                         if isinstance(manifest, dict) else f"{path}: expected a JSON object")
    for key in ("name", "parts", "sha256", "wheels"):
        if key not in manifest:
            raise ValueError(f"{path}: {key}: missing")
    for part in manifest["parts"]:
        if "/" in part["name"] or part["name"].startswith("."):
            raise ValueError(f"{path}: parts: {part['name']!r} is not a plain file name")
    for wheel in manifest["wheels"]:
        wheel_distribution(Path(wheel["name"]))
        if "/" in wheel["name"]:
            raise ValueError(f"{path}: wheels: {wheel['name']!r} is not a plain file name")
    return manifest


def check_parts(folder: Path, manifest: dict[str, Any], search: Iterable[Path] = ()) -> dict[str, list[str]]:
    """Which parts are here and whole, which missing, which damaged (size or digest). A part found in
    one of `search` folders (where a transfer left it) is moved in first."""
    report: dict[str, list[str]] = {"ok": [], "missing": [], "damaged": []}
    for part in manifest["parts"]:
        path = folder / part["name"]
        if not path.exists():
            for other in search:
                if (other / part["name"]).exists():
                    shutil.copyfile(other / part["name"], path.with_name(f".{part['name']}.tmp"))
                    os.replace(path.with_name(f".{part['name']}.tmp"), path)
                    break
        if not path.exists():
            report["missing"].append(part["name"])
        elif path.stat().st_size != part["bytes"] or sha256_file(path) != part["sha256"]:
            report["damaged"].append(part["name"])
        else:
            report["ok"].append(part["name"])
    return report


class _Joined(io.RawIOBase):
    """The parts read back to back as one stream, hashed as they are read."""

    def __init__(self, paths: list[Path]) -> None:
        self._paths: Iterator[Path] = iter(paths)
        self._handle: IO[bytes] | None = None
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while True:
            if self._handle is None:
                path = next(self._paths, None)
                if path is None:
                    return 0
                self._handle = open(path, "rb")
            count = self._handle.readinto(buffer)
            if count:
                self.digest.update(memoryview(buffer)[:count])
                return count
            self._handle.close()
            self._handle = None


def wheels_in_place(folder: Path, manifest: dict[str, Any]) -> bool:
    wheels = folder / "wheels"
    return all((wheels / w["name"]).is_file() and (wheels / w["name"]).stat().st_size == w["bytes"]
               for w in manifest["wheels"])


def unpack(folder: Path, manifest: dict[str, Any]) -> Path:
    """Every part checked first (check_parts); the joined stream's digest and each wheel's checked
    before `folder/wheels` appears (built beside it, renamed in): never half a wheelhouse."""
    target = folder / "wheels"
    if wheels_in_place(folder, manifest):
        return target
    staging = Path(tempfile.mkdtemp(prefix=".wheels-", dir=folder))
    try:
        joined = _Joined([folder / part["name"] for part in manifest["parts"]])
        buffered = io.BufferedReader(joined, CHUNK)
        with lzma.open(buffered, "rb") as xz, tarfile.open(fileobj=xz, mode="r|") as tar:
            for member in tar:
                if not member.isfile() or "/" in member.name or member.name.startswith("."):
                    raise ValueError(f"{folder}: the bundle holds {member.name!r}, not a wheel file")
                source = tar.extractfile(member)
                assert source is not None
                with open(staging / member.name, "wb") as handle:
                    shutil.copyfileobj(source, handle, CHUNK)
            while buffered.read(CHUNK):
                pass
        if joined.digest.hexdigest() != manifest["sha256"]:
            raise ValueError(f"{folder}: the joined parts' sha256 is not the manifest's")
        for wheel in manifest["wheels"]:
            path = staging / wheel["name"]
            if not path.is_file() or sha256_file(path) != wheel["sha256"]:
                raise ValueError(f"{folder}: {wheel['name']}: missing from the bundle or its sha256 differs")
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return target
