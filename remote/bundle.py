"""The agent bundle: what a host needs from this checkout (src/, patches/, runs/*.yaml).

The bundle is identified by a content hash. The host keeps the hash of what it has; an agent
call whose hash differs carries the bundle along in the same round trip, so a host never runs a
stale agent and nobody has to remember to sync first.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import tarfile
from pathlib import Path

from remote.errors import BadInput
from remote.inventory import REPO_ROOT

EXCLUDED_PARTS = {"__pycache__", ".pytest_cache", ".ruff_cache"}


def runs_dir(root: Path = REPO_ROOT) -> Path:
    """Where run configs come from: the checkout's runs/, or SPECOPS_RUNS_DIR (configs kept elsewhere)."""
    chosen = os.environ.get("SPECOPS_RUNS_DIR")
    if chosen and not Path(chosen).is_dir():
        raise BadInput(f"SPECOPS_RUNS_DIR={chosen}: not a directory of run configs")
    return Path(chosen) if chosen else root / "runs"


def patches_dir(root: Path = REPO_ROOT) -> Path:
    """Where the patch sets a host gets come from: the checkout's patches/, or SPECOPS_PATCH_SETS
    (sets kept elsewhere, as SPECOPS_RUNS_DIR is for run configs)."""
    chosen = os.environ.get("SPECOPS_PATCH_SETS")
    if chosen and not Path(chosen).is_dir():
        raise BadInput(f"SPECOPS_PATCH_SETS={chosen}: not a directory of patch sets")
    return Path(chosen) if chosen else root / "patches"


def bundle_files(root: Path = REPO_ROOT) -> dict[str, Path]:
    """Every file the host needs: its path on the host (relative to the workdir) -> its file here."""
    files: dict[str, Path] = {}
    for top, base in (("src", root / "src"), ("patches", patches_dir(root))):
        if base.exists():
            for path in base.rglob("*"):
                if (path.is_file() and not EXCLUDED_PARTS.intersection(path.parts)
                        and not path.name.endswith(".pyc") and ".egg-info" not in path.as_posix()):
                    files[f"{top}/{path.relative_to(base).as_posix()}"] = path
    runs = runs_dir(root)
    if runs.exists():
        files.update({f"runs/{path.name}": path for path in runs.glob("*.yaml")})
    return dict(sorted(files.items()))


class Bundle:
    """The files, their content hash and, built only when a host needs installing, their archive.

    Most tasks find the host current and need only the digest: hashing ~100 files is cheap, the
    gzip'd tar is not, so it is made on first use of `archive`.
    """

    def __init__(self, digest: str, sources: dict[str, Path], contents: dict[str, bytes]) -> None:
        self.digest = digest
        self.sources = sources  # path on the host -> where it comes from here
        self.files = tuple(sources)  # paths on the host, relative to the workdir
        self._contents = contents  # what was hashed: the archive holds exactly that

    @functools.cached_property
    def archive(self) -> bytes:
        """gzip'd tar of the files, deterministic (mode 0644, mtime 0, sorted)."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as archive:
            for relative, data in self._contents.items():
                info = tarfile.TarInfo(relative)
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                archive.addfile(info, io.BytesIO(data))
        return buffer.getvalue()


@functools.cache
def build_bundle(root: Path = REPO_ROOT) -> Bundle:
    files = bundle_files(root)
    hasher = hashlib.sha256()
    contents: dict[str, bytes] = {}
    for relative, source in files.items():
        data = contents[relative] = source.read_bytes()
        hasher.update(relative.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    return Bundle(hasher.hexdigest(), files, contents)


# Runs on the host with the host's python (any 3.8+): unpack the bundle read from stdin into the
# workdir. src/ and patches/ are replaced whole (a file deleted here disappears there); run configs
# are written one by one, since runs/<name>/ folders beside them hold the host's run outputs.
INSTALL_SCRIPT = r"""
import io, os, shutil, sys, tarfile, tempfile
workdir, digest = sys.argv[1], sys.argv[2]
data = sys.stdin.buffer.read()
incoming = tempfile.mkdtemp(prefix=".agent-incoming-", dir=workdir)
with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
    for member in archive.getmembers():
        if member.name.startswith("/") or ".." in member.name.split("/") or not member.isfile():
            raise SystemExit("refusing bundle member " + member.name)
        target = os.path.join(incoming, member.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with archive.extractfile(member) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
for top in ("src", "patches"):
    fresh, current = os.path.join(incoming, top), os.path.join(workdir, top)
    if not os.path.isdir(fresh):
        continue
    old = current + ".old-" + os.path.basename(incoming)
    if os.path.exists(current):
        os.rename(current, old)
    os.rename(fresh, current)
    shutil.rmtree(old, ignore_errors=True)
runs_in = os.path.join(incoming, "runs")
if os.path.isdir(runs_in):
    os.makedirs(os.path.join(workdir, "runs"), exist_ok=True)
    for name in os.listdir(runs_in):
        os.replace(os.path.join(runs_in, name), os.path.join(workdir, "runs", name))
shutil.rmtree(incoming, ignore_errors=True)
os.makedirs(os.path.join(workdir, "state"), exist_ok=True)
note = None  # state/revision.json: install_script() puts the workstation's revision here
if note is not None:  # before the hash: a crash between leaves a note the agent does not believe
    tmp = os.path.join(workdir, "state", ".revision.json.tmp")
    with open(tmp, "w") as handle:
        handle.write(note)
    os.replace(tmp, os.path.join(workdir, "state", "revision.json"))
tmp = os.path.join(workdir, "state", ".agent.sha256.tmp")
with open(tmp, "w") as handle:
    handle.write(digest)
    handle.flush()
    os.fsync(handle.fileno())
os.replace(tmp, os.path.join(workdir, "state", "agent.sha256"))
"""


def install_script(note: str) -> str:
    """INSTALL_SCRIPT that also writes state/revision.json (`note`, remote.revision.revision_note): the revision
    travels with the bundle, as it does with a sync, so the host's agent can say which specops it is."""
    return INSTALL_SCRIPT.replace("note = None  #", f"note = {note!r}  #", 1)
