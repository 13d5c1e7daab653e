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
from specops.contract import commandline


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


def fetch_from_saver(host: str | None, hosts: str, run: str | None, *,
                     with_training_state: bool = False) -> dict[str, Any]:
    """A run trained across hosts keeps its checkpoints where they were saved (torchrun's rank 0): ask the
    hosts in order; one without a finished checkpoint says so (exit 2) and the next is asked."""
    from remote.inventory import load_inventory
    from remote.session import HostSession
    from remote.several_hosts import chosen_hosts

    inventory = load_inventory()
    members = chosen_hosts(inventory, host, hosts, False) or []
    run_name = run or members[0].run
    refusals = []
    for member in members:
        with HostSession(member, inventory) as session:
            try:
                return {**fetch_run(session.conn, member, run_name, with_training_state=with_training_state),
                        "host": member.name}
            except BadInput as refusal:  # this host has no finished checkpoint of the run
                refusals.append(str(refusal))
    raise BadInput(f"--hosts: no host holds a finished checkpoint of run {run_name}: {'; '.join(refusals)}")


def _agent(conn: Connection, host: Host, args: list[str]) -> dict[str, Any]:
    result = agent_call(conn, host, args)
    if not result.ok:
        error = result.document.get("error", "fetch-list failed")
        raise (BadInput if result.exit_code == 2 else AgentError)(f"{host.name}: {error}")
    return result.document
