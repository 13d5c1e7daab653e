"""`invoke sync`: push src/, patches/ and runs/*.yaml to the host's workdir, and nothing else.

rsync over the same SSH settings as our own connections (the inventory's key, port, known_hosts
with strict checking, jump host; remote.ssh.openssh) when the host has rsync, through a shared
OpenSSH master (ControlPersist) so a repeated sync skips the SSH handshake; SFTP otherwise. Only changed files move.
The host's own things in the workdir (state/, logs/, runs/<run>/ outputs, models/) are never
touched: rsync only deletes what it would have sent. The agent bundle hash and the revision land
in state/ in the same transfer, so the next agent call finds the host current.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote import journal
from remote.bundle import build_bundle, patches_dir, runs_dir
from remote.errors import ConnectError, SpecopsError
from remote.inventory import REPO_ROOT, Host, Inventory
from remote.revision import current_revision, revision_note
from remote.ssh import kind_of

# Sender-side filter: what a host needs. Excluded paths on the receiver are protected from --delete.
RSYNC_FILTERS = [
    "--exclude=__pycache__/", "--exclude=*.pyc", "--exclude=*.egg-info/", "--exclude=.pytest_cache/",
    "--exclude=.ruff_cache/",
    "--include=/src/***", "--include=/patches/***", "--include=/runs/", "--include=/runs/*.yaml",
    "--include=/state/", "--include=/state/agent.sha256", "--include=/state/revision.json",
    "--exclude=*",
]


class RsyncUnavailable(SpecopsError):
    """rsync is missing here or on the host: the caller falls back to SFTP."""


@dataclass
class SyncReport:
    method: str
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    dry_run: bool = False
    revision: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"ok": True, "method": self.method, "changed": self.changed, "deleted": self.deleted,
                "dry_run": self.dry_run, "revision": self.revision}


def _state_folder() -> Path:
    """A folder holding `state/agent.sha256` and `state/revision.json` as this checkout has them now.

    Kept beside the agent-current markers (SPECOPS_LOGS) and rewritten atomically each sync, so no
    temporary tree is made and removed per sync (directory removal costs ~4 ms a folder here).
    """
    folder = journal.journal_path().parent / "sync-state"
    state = folder / "state"
    state.mkdir(parents=True, exist_ok=True)
    digest = build_bundle().digest
    wanted = {"agent.sha256": digest, "revision.json": revision_note(digest)}
    for name, text in wanted.items():
        path = state / name
        if not path.exists() or path.read_text() != text:
            fd, temporary = tempfile.mkstemp(prefix=f".{name}.", dir=state)  # excluded by the filters
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            os.replace(temporary, path)
    return folder


def _sources() -> tuple[list[str], Path | None]:
    """rsync's source folders, and a staging folder to remove afterwards (or None).

    Normally the checkout itself (the filters pick src/, patches/, runs/*.yaml) plus the state folder:
    nothing copied or linked. Patch sets or run configs kept elsewhere (SPECOPS_PATCH_SETS,
    SPECOPS_RUNS_DIR) are staged as the bundle lays them out: hard links where the filesystem allows.
    """
    state = _state_folder()
    if patches_dir() == REPO_ROOT / "patches" and runs_dir() == REPO_ROOT / "runs":
        return [f"{REPO_ROOT}/", f"{state}/"], None
    folder = Path(tempfile.mkdtemp(prefix="specops-sync-"))
    for relative, source in build_bundle().sources.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, folder / relative)
        except OSError:  # another filesystem, or links not allowed
            shutil.copy2(source, folder / relative)
    return [f"{folder}/", f"{state}/"], folder


def _parse_itemized(output: str, report: SyncReport) -> None:
    """Files whose content moved ('<' sent, '>' received, 'c' created, 'h' linked). A '.' line only
    touched attributes (the agent's install by `check` leaves other mtimes): the content was equal."""
    for line in output.splitlines():
        if line.startswith("*deleting"):
            report.deleted.append(line.split(None, 1)[1])
        elif len(line) > 12 and line[0] in "<>ch" and line[1] == "f":
            name = line[12:].strip() if line[11] == " " else line.split(None, 1)[1]
            if not name.startswith("state/"):
                report.changed.append(name)


def rsync_sync(host: Host, *, dry_run: bool = False, inventory: Inventory | None = None) -> SyncReport:
    sources, staging = _sources()
    try:
        # -L: a symlinked file travels as its content, as the bundle hashes it.
        argv = ["rsync", "-rLptc", "--delete", "--itemize-changes", *RSYNC_FILTERS]
        if dry_run:
            argv.append("--dry-run")
        options, destination = kind_of(host).rsync_destination(host, inventory)
        argv += [*options, *sources, destination]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        except FileNotFoundError:
            raise RsyncUnavailable("rsync is not installed on this workstation") from None
        if proc.returncode != 0 and ("rsync: command not found" in proc.stderr or "rsync: not found" in proc.stderr):
            raise RsyncUnavailable(f"{host.name}: the host has no rsync")
        if proc.returncode != 0:
            message = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
            if "Host key verification failed" in proc.stderr or "REMOTE HOST IDENTIFICATION" in proc.stderr:
                raise ConnectError(f"{host.name}: rsync refused: host key not verified against {host.known_hosts}")
            raise SpecopsError(f"{host.name}: rsync failed: {message}")
        report = SyncReport("rsync", dry_run=dry_run, revision=current_revision())
        _parse_itemized(proc.stdout, report)
        return report
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _wanted_files() -> dict[str, Path]:
    return dict(build_bundle().sources)


def sftp_sync(conn: Any, host: Host, *, dry_run: bool = False) -> SyncReport:
    """The fallback for hosts without rsync: compare size and content hash, send what differs."""
    import hashlib

    report = SyncReport("sftp", dry_run=dry_run, revision=current_revision())
    sftp = conn.sftp()  # an SSHConnection's (fabric's) one SFTP session, closed with the connection
    root = host.workdir
    if root.startswith("~/"):
        root = sftp.normalize(".") + "/" + root[2:]

    def listing(path: str) -> dict[str, int]:
        found: dict[str, int] = {}
        try:
            entries = sftp.listdir_attr(path)
        except FileNotFoundError:
            return found
        for entry in entries:
            child = f"{path}/{entry.filename}"
            if entry.filename == "__pycache__":
                continue
            if stat.S_ISDIR(entry.st_mode or 0):
                found.update(listing(child))
            else:
                found[child] = entry.st_size or 0
        return found

    remote_files: dict[str, int] = {}
    for top in ("src", "patches"):
        remote_files.update(listing(f"{root}/{top}"))
    try:
        remote_files.update({f"{root}/runs/{entry.filename}": entry.st_size or 0
                             for entry in sftp.listdir_attr(f"{root}/runs")
                             if entry.filename.endswith(".yaml") and not stat.S_ISDIR(entry.st_mode or 0)})
    except FileNotFoundError:
        pass
    wanted = _wanted_files()
    for relative, local in wanted.items():
        remote_path = f"{root}/{relative}"
        data = local.read_bytes()
        if remote_files.get(remote_path) == len(data):
            with sftp.open(remote_path, "rb") as handle:
                if hashlib.sha256(handle.read()).digest() == hashlib.sha256(data).digest():
                    continue
        report.changed.append(relative)
        if not dry_run:
            _sftp_makedirs(sftp, os.path.dirname(remote_path))
            with sftp.open(remote_path + ".specops-tmp", "wb") as handle:
                handle.write(data)
            sftp.posix_rename(remote_path + ".specops-tmp", remote_path)
    for remote_path in sorted(set(remote_files) - {f"{root}/{relative}" for relative in wanted}):
        report.deleted.append(remote_path[len(root) + 1:])
        if not dry_run:
            sftp.remove(remote_path)
    if not dry_run:
        _sftp_makedirs(sftp, f"{root}/state")
        digest = build_bundle().digest
        for name, text in (("agent.sha256", digest), ("revision.json", revision_note(digest))):
            with sftp.open(f"{root}/state/{name}.specops-tmp", "w") as handle:
                handle.write(text)
            sftp.posix_rename(f"{root}/state/{name}.specops-tmp", f"{root}/state/{name}")
    return report


def _sftp_makedirs(sftp, path: str) -> None:
    parts = path.split("/")
    for end in range(2, len(parts) + 1):
        partial = "/".join(parts[:end])
        if not partial:
            continue
        try:
            sftp.stat(partial)
        except FileNotFoundError:
            sftp.mkdir(partial)


