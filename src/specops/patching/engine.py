"""Apply and revert one patch set: plan every target file first, write only when all of them fit.

A target's state comes from three hashes: the file now, the recorded pre/post images, and the
package's RECORD entry for the file (what a fresh install of the installed version contains).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

from specops.host import atomic
from specops.host.installed import normalise
from specops.patching import records
from specops.patching.records import SetRecord, sha256
from specops.patching.rewrite import Misfit, apply_patches, unified_diff
from specops.patching.selection import Environment
from specops.patching.spec import Patch, PatchSet

# state codes (stable JSON) -> what they mean
STATES = {
    "applied": "applied",
    "not-applied": "not applied",
    "stale": "applied, but the patch spec changed since; apply again",
    "reinstalled": "package reinstalled, patch gone",
    "upstream-changed": "upstream file changed",
    "hand-edited": "hand-edited since apply",
    "missing": "target module not found",
}


@dataclass
class Target:
    module: str
    patches: list[Patch]
    file: Path | None
    current: bytes | None = None
    package_sha: str | None = None  # the installed package's RECORD hash for the file
    state: str = "not-applied"
    detail: str = ""
    base: bytes | None = None  # the pristine text the patches apply to
    post: bytes | None = None
    misfits: list[Misfit] = field(default_factory=list)

    @property
    def needs_write(self) -> bool:
        return self.post is not None and self.post != self.current and not self.misfits


def _decode(data: bytes) -> str:
    # surrogateescape keeps any byte that is not UTF-8, so the round trip is byte-exact
    return data.decode("utf-8", errors="surrogateescape")


def _encode(text: str) -> bytes:
    return text.encode("utf-8", errors="surrogateescape")


def _classify(target: Target, patch_set: PatchSet, record: SetRecord | None, env: Environment) -> None:
    entry = record.files.get(target.module) if record else None
    assert target.current is not None
    now = sha256(target.current)
    if entry is None:
        target.state, target.base = "not-applied", target.current
        return
    digests = record.document.get("patches", {}) if record else {}
    current_digests = {patch.id: patch.digest for patch in target.patches}
    recorded_version = record.document.get("package", {}).get("version") if record else None
    installed_version = env.version(patch_set.package)
    if now == entry["post_sha256"]:
        same_spec = all(digests.get(pid) == digest for pid, digest in current_digests.items())
        same_spec = same_spec and sorted(entry.get("patches", [])) == sorted(current_digests)
        target.state = "applied" if same_spec else "stale"
        if not same_spec:
            changed = [p.source.name for p in target.patches if digests.get(p.id) != p.digest]
            dropped = sorted(set(entry.get("patches", [])) - set(current_digests))
            what = ", ".join([*changed, *(f"{pid} (removed)" for pid in dropped)])
            target.detail = f"{STATES['stale']}: {what} changed since apply"
        target.base = record.pristine(target.module) if record else None
        if target.base is None or sha256(target.base) != entry["pre_sha256"]:
            target.state, target.detail = "hand-edited", "the saved pristine copy is missing or damaged"
            target.base = None
        return
    if now == target.package_sha or now == entry["pre_sha256"]:
        target.base = target.current
        if target.package_sha is not None and target.package_sha != entry["pre_sha256"]:
            target.state = "upstream-changed"
            target.detail = (f"file is {patch_set.package} {installed_version}'s original, applied against "
                             f"{recorded_version}'s")
        else:
            target.state = "reinstalled"
        return
    target.state = "upstream-changed" if installed_version != recorded_version else "hand-edited"
    target.detail = (f"{target.file} matches neither the patched image, the pristine image nor "
                     f"{patch_set.package} {installed_version}'s RECORD")
    if target.state == "upstream-changed":
        target.detail += f"; {patch_set.package} went from {recorded_version} to {installed_version} since apply"
    else:
        target.detail += f"; {patch_set.package} is still {installed_version}: {STATES['hand-edited']}"


def records_site(patch_set: PatchSet, env: Environment) -> Path | None:
    """The site directory of the distribution the set patches: its records live there."""
    dist = env.dists.get(normalise(patch_set.package))
    return dist.site if dist else None


def plan(patch_set: PatchSet, env: Environment) -> list[Target]:
    """Every target of the set with its state and, where it fits, the text after patching."""
    record = records.load(patch_set.name, records_site(patch_set, env))
    dist = env.dists.get(normalise(patch_set.package))
    targets = []
    for module in patch_set.modules():
        file = env.source_file(module)
        target = Target(module, patch_set.patches_for(module), file)
        targets.append(target)
        if file is None:
            target.state, target.detail = "missing", f"module {module}: no Python source on the search path"
            continue
        target.current = file.read_bytes()
        target.package_sha = dist.recorded_sha256(file) if dist else None
        _classify(target, patch_set, record, env)
        if target.base is not None:
            post, target.misfits = apply_patches(_decode(target.base), target.patches, str(file))
            target.post = _encode(post)
        if not target.detail:
            target.detail = STATES[target.state]
    return targets


def refusals(targets: list[Target]) -> list[str]:
    """Why the set cannot be applied as a whole; empty when every target fits."""
    problems = []
    for target in targets:
        if target.state == "missing":
            problems.append(target.detail)
        elif target.base is None:
            problems.append(f"{target.file}: {STATES[target.state]} ({target.detail}); "
                            "revert or reinstall the package first")
        problems.extend(misfit.detail for misfit in target.misfits)
    return problems


def diff(targets: list[Target]) -> str:
    return "".join(unified_diff(_decode(t.current or b""), _decode(t.post or b""), str(t.file))
                   for t in targets if t.needs_write)


def drop_bytecode(file: Path) -> None:
    cache = file.parent / "__pycache__"
    if cache.is_dir():
        for stale in cache.glob(f"{file.stem}.*.pyc"):
            stale.unlink(missing_ok=True)


def write(patch_set: PatchSet, targets: list[Target], env: Environment) -> None:
    """Record first (pristine copies, hashes, versions), then the patched files, atomically each."""
    site = records_site(patch_set, env)
    record = records.load(patch_set.name, site) or SetRecord(records.set_folder(patch_set.name, site), {})
    record.document.update({
        "set": patch_set.name,
        "applied_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "package": {"name": patch_set.package, "version": env.version(patch_set.package)},
        "requires": {name: env.version(name) for name in patch_set.requires},
        "patches": {patch.id: patch.digest for patch in patch_set.patches},
    })
    pristine = {}
    for target in targets:
        assert target.base is not None and target.post is not None and target.file is not None
        pristine[target.module] = target.base
        record.files[target.module] = {
            "file": str(target.file),
            "pre_sha256": sha256(target.base),
            "post_sha256": sha256(target.post),
            "package_sha256": target.package_sha,
            "patches": [patch.id for patch in target.patches],
        }
    records.save(record, pristine)
    for target in targets:
        assert target.file is not None and target.post is not None
        if target.post != target.current:
            atomic.write_bytes(target.file, target.post, mode=target.file.stat().st_mode & 0o7777)
            drop_bytecode(target.file)


def revert(patch_set: PatchSet, env: Environment) -> tuple[list[str], list[str]]:
    """Restore every recorded file's pristine original; returns (restored files, problems)."""
    record = records.load(patch_set.name, records_site(patch_set, env))
    if record is None:
        return [], []
    targets = {t.module: t for t in plan(patch_set, env)}
    problems, restores = [], []
    for module, entry in record.files.items():
        file = Path(entry["file"])
        original = record.pristine(module)
        if original is None or sha256(original) != entry["pre_sha256"]:
            problems.append(f"{file}: the saved pristine copy is missing or damaged; reinstall the package")
            continue
        now = sha256(file.read_bytes()) if file.is_file() else None
        target = targets.get(module)
        if now == entry["pre_sha256"] or (target is not None and now == target.package_sha):
            continue  # already an original (package reinstalled)
        if now != entry["post_sha256"]:
            state = STATES[target.state] if target else "changed since apply"
            problems.append(f"{file}: {state}; refusing to overwrite it, reinstall the package instead")
            continue
        restores.append((file, original))
    if problems:
        return [], problems
    for file, original in restores:
        atomic.write_bytes(file, original, mode=file.stat().st_mode & 0o7777)
        drop_bytecode(file)
        if sha256(file.read_bytes()) != sha256(original):
            problems.append(f"{file}: restored bytes do not match the pristine hash")
    if not problems:
        records.clear(patch_set.name, records_site(patch_set, env))
    return [str(file) for file, _ in restores], problems
