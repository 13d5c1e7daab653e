"""`invoke sync`: push src/, patches/ and runs/*.yaml to the host's workdir, and nothing else.

rsync over the same SSH settings as our own connections (the inventory's key, port, known_hosts
with strict checking, jump host) when the host has rsync; SFTP otherwise. Only changed files move.
The host's own things in the workdir (state/, logs/, runs/<run>/ outputs, models/) are never
touched: rsync only deletes what it would have sent. The agent bundle hash and the revision land
in state/ in the same transfer, so the next agent call finds the host current.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote.bundle import build_bundle
from remote.errors import ConnectError, SpecopsError
from remote.inventory import Host, Inventory
from remote.revision import current_revision
from remote.ssh import jump_host, resolve_target

# Sender-side filter: what a host needs. Excluded paths on the receiver are protected from --delete.
RSYNC_FILTERS = [
    "--exclude=__pycache__/", "--exclude=*.pyc", "--exclude=*.egg-info/",
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


def _ssh_options(host: Host) -> list[str]:
    """OpenSSH client options equal to our own connection's: key, port, strict known_hosts, timeouts."""
    target = resolve_target(host)
    known_hosts = os.path.expanduser(host.known_hosts)
    parts = ["-p", str(target.port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
             "-o", f"UserKnownHostsFile={known_hosts}", "-o", f"ConnectTimeout={int(host.connect_timeout)}",
             "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", "IPQoS=throughput"]
    for identity in target.identity_files:
        parts += ["-i", identity, "-o", "IdentitiesOnly=yes"]
    return parts


def _ssh_command(host: Host, inventory: Inventory | None) -> str:
    parts = ["ssh", *_ssh_options(host)]
    jump = jump_host(host, inventory)
    if jump is not None:
        # Not -J: OpenSSH would reach the jump host without our key and known_hosts. A ProxyCommand
        # carries the jump host's own settings, host-key verification included.
        jump_target = resolve_target(jump)
        user = f"{jump_target.user}@" if jump_target.user else ""
        proxy = shlex.join(["ssh", *_ssh_options(jump), "-W", "%h:%p", f"{user}{jump_target.hostname}"])
        parts += ["-o", f"ProxyCommand={proxy}"]
    return shlex.join(parts)


def _remote_workdir(host: Host) -> str:
    # rsync's remote shell expands ~ for us only when unquoted; give it a home-relative path.
    return host.workdir[2:] if host.workdir.startswith("~/") else host.workdir


def _staging() -> Path:
    """The tree the host should have: the bundle's files (mtimes kept) and the state files with them.

    Hard links where the filesystem allows (the files themselves, nothing copied), copies elsewhere.
    """
    folder = Path(tempfile.mkdtemp(prefix="specops-sync-"))
    for relative, source in build_bundle().sources.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, folder / relative)
        except OSError:  # another filesystem, or links not allowed
            shutil.copy2(source, folder / relative)
    (folder / "state").mkdir()
    (folder / "state" / "agent.sha256").write_text(build_bundle().digest)
    (folder / "state" / "revision.json").write_text(json.dumps(current_revision()) + "\n")
    return folder


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
    staging = _staging()
    try:
        argv = ["rsync", "-rlptc", "--delete", "--itemize-changes", *RSYNC_FILTERS]
        if dry_run:
            argv.append("--dry-run")
        if host.is_local:
            Path(host.workdir).mkdir(parents=True, exist_ok=True)
            destination = host.workdir.rstrip("/") + "/"
        else:
            target = resolve_target(host)
            user = f"{target.user}@" if target.user else ""
            argv += ["-e", _ssh_command(host, inventory), "--rsync-path",
                     f"mkdir -p {shlex.quote(_remote_workdir(host))} && rsync"]
            destination = f"{user}{target.hostname}:{_remote_workdir(host).rstrip('/')}/"
        argv += [f"{staging}/", destination]
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
        for name, text in (("agent.sha256", build_bundle().digest),
                           ("revision.json", json.dumps(current_revision()) + "\n")):
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


