"""Job records: one JSON file per job under state/jobs, the host's truth about its jobs.

Every change is a read-modify-write under one lock file (the wrapper, `stop` and `list` may all
touch a record at once) and lands through an atomic write, so a reader never sees half a record.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from specops.contract.errors import BadInput
from specops.contract.protocol import JobRecord
from specops.host import atomic, paths

# Ids double as file names and tmux session names: tmux rejects '.' and ':' in session names.
_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]+")
_SLUG_LENGTH = 40

_lock_handle: int | None = None
_lock_depth = 0


def jobs_dir(workdir: str | os.PathLike[str] | None = None) -> Path:
    """This workdir's job records (created on demand), or those of `workdir` (another run's, on this host)."""
    return paths.state_dir("jobs") if workdir is None else Path(workdir) / "state" / "jobs"


def record_path(job_id: str, workdir: str | os.PathLike[str] | None = None) -> Path:
    return jobs_dir(workdir) / f"{job_id}.json"


def environ_path(job_id: str) -> Path:
    """The launching agent's environment, handed to the wrapper (kept apart: it may hold secrets)."""
    return jobs_dir() / f"{job_id}.environ.json"


def logs_dir() -> Path:
    path = paths.workdir() / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text)


def slug(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_-")[:_SLUG_LENGTH]
    return cleaned or "job"


def new_job_id(name: str, when: datetime | None = None) -> str:
    stamp = (when or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    import secrets  # only a launch makes an id: listing jobs starts without it

    return f"{slug(name)}-{stamp}-{secrets.token_hex(2)}"


def is_job_id(text: str) -> bool:
    return bool(_ID_PATTERN.fullmatch(text))


@contextmanager
def locked() -> Iterator[None]:
    """Hold the jobs lock; re-entrant within this process (flock would deadlock on itself)."""
    global _lock_handle, _lock_depth
    if _lock_depth == 0:
        handle = os.open(jobs_dir() / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(handle, fcntl.LOCK_EX)
        _lock_handle = handle
    _lock_depth += 1
    try:
        yield
    finally:
        _lock_depth -= 1
        if _lock_depth == 0 and _lock_handle is not None:
            os.close(_lock_handle)  # closing releases the flock
            _lock_handle = None


def load(job_id: str) -> JobRecord:
    if not is_job_id(job_id):
        raise BadInput(f"job id {job_id!r}: only letters, digits, '_' and '-' are allowed")
    path = record_path(job_id)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BadInput(f"no job with id {job_id!r} in {jobs_dir()}") from None
    return json.loads(text)


def save(record: JobRecord) -> None:
    atomic.write_json(record_path(record["id"]), record)


def update(job_id: str, change: Callable[[JobRecord], None]) -> JobRecord:
    """Apply `change` to the freshest copy of the record, under the lock, and persist it."""
    with locked():
        record = load(job_id)
        before = dict(record)
        change(record)
        if record != before:
            save(record)
        return record


def all_records() -> list[JobRecord]:
    """Every job record, oldest first."""
    found = []
    for path in jobs_dir().glob("*.json"):
        if path.name.startswith(".") or path.name.endswith(".environ.json"):
            continue
        try:
            found.append(load(path.stem))
        except BadInput:  # vanished between glob and read
            continue
    return sorted(found, key=lambda record: (record["created"], record["id"]))


def resolve(reference: str, run: str | None = None) -> JobRecord:
    """A job by exact id, else the newest job of that name (in `run`, when given)."""
    if is_job_id(reference) and record_path(reference).exists():
        return load(reference)
    named = [record for record in all_records()
             if record["name"] == reference and (run is None or record["run"] == run)]
    if not named:
        where = f" in run {run!r}" if run is not None else ""
        raise BadInput(f"no job with id or name {reference!r}{where}")
    return named[-1]
