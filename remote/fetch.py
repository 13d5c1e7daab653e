"""Bring a run's results home: the newest finished checkpoint, metrics, plot, logs; every file hash-verified.

The host lists a snapshot (copies nothing else writes, so a fetch while training runs is consistent);
files land in fetched/<host>/<run>/ (checkpoint/ is the folder vLLM loads as a speculative model).
They are downloaded into a temporary sibling folder, checked against the sha256 and size the host
computed, and only then swapped into place, so an interrupted fetch never leaves a mixed folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from remote.agent import agent_call
from remote.errors import AgentError, BadInput, SpecopsError
from remote.files import swap_folder
from remote.inventory import REPO_ROOT, Host
from remote.names import inside, safe_name
from remote.ssh import Connection
from specops import commandline


def fetched_root() -> Path:
    return Path(os.environ.get("SPECOPS_FETCHED") or REPO_ROOT / "fetched")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_run(conn: Connection, host: Host, run: str, *, with_training_state: bool = False) -> dict[str, Any]:
    """Download the host's snapshot of the run (see specops.pipeline.fetch), verify, swap into place, drop it."""
    destination = inside(fetched_root(), safe_name(host.name, "host"), safe_name(run, "--run"), what="fetch folder")
    listing = _agent(conn, host, commandline.fetch_list(run=run, with_training_state=with_training_state))
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{run}.incoming-", dir=destination.parent))
    try:
        for entry in listing["files"]:
            local = inside(staging, entry["name"], what=f"{host.name}: fetched file")  # named by the host
            local.parent.mkdir(parents=True, exist_ok=True)
            conn.download(entry["path"], local)  # the task's connection: SFTP over SSH, a copy on `local`
            if local.stat().st_size != entry["size"] or _sha256(local) != entry["sha256"]:
                raise SpecopsError(f"{host.name}: {entry['path']}: size or sha256 differs after transfer")
        swap_folder(staging, destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        if listing.get("snapshot"):  # the snapshot's copies on the host have served their purpose
            try:
                _agent(conn, host, commandline.fetch_list(run=run, drop=listing["snapshot"]))
            except SpecopsError:  # the connection dropped: a later fetch clears stale snapshots
                pass
    return {**listing, "destination": str(destination), "verified": len(listing["files"])}


def _agent(conn: Connection, host: Host, args: list[str]) -> dict[str, Any]:
    result = agent_call(conn, host, args)
    if not result.ok:
        error = result.document.get("error", "fetch-list failed")
        raise (BadInput if result.exit_code == 2 else AgentError)(f"{host.name}: {error}")
    return result.document
