"""A server shared between runs: which running server fits another run, and one user at a time.

A second pipeline on the same target (another run, another workdir on the host) finds the port held by a
`vllm-server` job of someone else. It uses that server instead of loading its own when the server FITS:
its recorded signature (vllm/job.py `server_signature`, vllm/generation.py) equals the one this run wants
in everything vLLM or its clients would notice (CONTRIBUTING: which serve keys matter), leaving out

- `model`, the path: a copy of the same weights (`model_digest`) and tokenizer (`tokenizer_digest`)
  serves the same; clients send the server's own served name (/v1/models), not their path;
- `staging`, where the extraction server writes captures: the response names each file
  (kv_transfer_params.hidden_states_path) and speculators moves it from there; it must lie on the
  run's own filesystem, so that the move is a rename, never a byte copy an interruption truncates.

A server that does not fit is refused as before (vllm/ports.py), naming what differs.

One user at a time (`hold`): whoever sends a server requests, stops it or replaces it holds an exclusive
flock on `<its workdir>/state/jobs/<job>.use` meanwhile. Regenerate's sweep removes every finished
capture in the staging folder (vllm/captures.py), so a second run extracting through the same server at
that moment would lose its files; and an owner that stops its server (its last step, a replacement, the
idle timeout) waits for the borrower's step to end instead of killing its requests. The lock is the
process's until `release` (the engine, after each step) or its exit (the kernel drops it), so a killed
user never leaves the server locked.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specops.contract.errors import BadInput
from specops.contract.progress import speaker
from specops.jobs import records

# left out of the comparison between runs: see the module docstring
NOT_COMPARED = ("model", "staging")
# what every server a run starts shares, whatever its step asks (extraction or generation): the launch
# boundary compares these before any step (and the layer ids when the run's first server captures: ports.py),
# the step compares the whole signature
RUN_WIDE = ("model_digest", "tokenizer_digest", "serve_args", "trust_remote_code", "vllm_program")
_WAIT_POLL_S = 0.5
_WAIT_SAY_S = 30.0

say = speaker("vllm")
_held: dict[str, int] = {}  # lease path -> open descriptor holding its flock


def fit_view(signature: dict[str, Any]) -> dict[str, Any]:
    """The signature as another run compares it: no model path (an argv's copy of it masked), no staging."""
    model = signature.get("model")
    view = {key: value for key, value in signature.items() if key not in NOT_COMPARED}
    if isinstance(view.get("argv"), list):
        view["argv"] = ["<model>" if part == model else part for part in view["argv"]]
    return view


def misfit(recorded: Any, wanted: dict[str, Any], keys: tuple[str, ...] | None = None) -> list[str]:
    """The keys in which a running server's recorded signature does not fit the one wanted ([] = fits)."""
    if not isinstance(recorded, dict):
        return ["signature (none recorded)"]
    have, want = fit_view(recorded), fit_view(wanted)
    compared = keys if keys is not None else tuple(set(have) | set(want))
    return sorted(key for key in compared if have.get(key) != want.get(key))


@dataclass(frozen=True)
class Borrowed:
    """Another run's running server job that fits this run: its record, as its own workdir keeps it."""

    record: dict[str, Any]
    workdir: str
    run: str

    @property
    def staging(self) -> str | None:
        return ((self.record.get("meta") or {}).get("server") or {}).get("staging")

    def describe(self) -> dict[str, Any]:
        return {"run": self.run, "workdir": self.workdir, "job": self.record["id"]}


def job_record(workdir: str | os.PathLike[str], job: str) -> dict[str, Any]:
    """A job's record in another workdir ({} when it cannot be read). The id comes from another process's
    environment: one that is no job id never becomes a path."""
    import json

    if not records.is_job_id(job):
        return {}
    try:
        return json.loads(records.record_path(job, workdir).read_text())
    except (OSError, ValueError):
        return {}


def is_kept(record: dict[str, Any]) -> bool:
    """A server its run left up for the next run on the target (vllm.keep_server), not yet stopped: the next
    run may use it and, when it needs the port or the GPUs, stop it (vllm/handover.py)."""
    keep = (record.get("meta") or {}).get("keep")
    return isinstance(keep, dict) and not keep.get("stopped")


def same_filesystem(staging: str | None, run_dir: Path) -> bool:
    """Whether a capture staged there reaches the run's folder by a rename (one device)."""
    if not staging:
        return True  # a generating server stages nothing
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        return os.stat(staging).st_dev == os.stat(run_dir).st_dev
    except OSError:
        return False


def borrow(holder: Any, wanted: dict[str, Any], run_dir: Path) -> tuple[Borrowed | None, list[str]]:
    """(the holder's server job when it fits `wanted`, else None; what does not fit). `holder` is
    ports.Holder: the process on the port and the specops job it belongs to, if any."""
    record = holder.server_record() if holder is not None else None
    if record is None:
        return None, ["not a specops vLLM server"]
    if not record:
        return None, ["its job record (unreadable)"]
    differences = misfit((record.get("meta") or {}).get("server"), wanted)
    found = Borrowed(record, holder.workdir, str(record.get("run")))
    if not differences and not same_filesystem(found.staging, run_dir):
        differences = ["staging (another filesystem)"]
    return (None if differences else found), differences


def lease_path(workdir: str | os.PathLike[str], job: str) -> Path:
    """Beside the server's job record: whoever sends it requests, stops or replaces it holds this."""
    if not records.is_job_id(job):
        raise BadInput(f"vLLM server job {job!r}: only letters, digits, '_' and '-' are allowed")
    return records.jobs_dir(workdir) / f"{job}.use"


def user_of(path: Path) -> str:
    """Who holds a lease now, as they wrote it ('' when unknown)."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def hold(workdir: str | os.PathLike[str], job: str, who: str, *, wait_s: float | None = None) -> bool:
    """Take the server job's lease for this process (at once if it holds it already); wait while another
    holds it, saying who every 30 s, at most `wait_s` seconds (None: as long as it takes). False: not taken."""
    path = lease_path(workdir, job)
    key = str(path)
    if key in _held:
        return True
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    started, said = time.monotonic(), None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            waited = time.monotonic() - started
            if wait_s != 0 and (said is None or time.monotonic() - said >= _WAIT_SAY_S):  # at once, every 30 s
                said = time.monotonic()
                say(f"waiting for vLLM server job {job}: in use by {user_of(path) or 'another process'} "
                    f"({round(waited)} s so far)")
            if wait_s is not None and waited >= wait_s:
                os.close(fd)
                return False
            time.sleep(_WAIT_POLL_S)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{who} (pid {os.getpid()})\n".encode(), 0)
    _held[key] = fd
    return True


def release(workdir: str | os.PathLike[str], job: str) -> None:
    fd = _held.pop(str(lease_path(workdir, job)), None)
    if fd is not None:
        os.close(fd)  # closing drops the flock


def release_all() -> None:
    """Every lease this process holds (the engine calls it after each step)."""
    while _held:
        os.close(_held.popitem()[1])


def in_use(workdir: str | os.PathLike[str], job: str) -> bool:
    """Whether another process holds the lease now."""
    path = lease_path(workdir, job)
    if str(path) in _held or not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
