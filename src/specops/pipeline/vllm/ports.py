"""Who holds a port, asked before a server is launched: a port held by anything but this run's own server
job, or another run's server that fits this run (vllm/sharing.py: used as it is), is refused with one line
(who holds it, what does not fit, how to free it, which setting moves the port), exit 2.

Without this check the new server loads for tens of seconds (18 minutes for a large target) and then
dies on `OSError: [Errno 98] Address already in use`. The holder is found from /proc: the socket
listening on the port (/proc/net/tcp{,6}), the process holding it open, and that process's
environment, where a specops job's wrapper leaves SPECOPS_JOB_ID and SPECOPS_WORKDIR (so another
workdir's server is named by its job and run, not only its pid).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput
from specops.pipeline.vllm import sharing
from specops.pipeline.vllm.readiness import listening_inodes, socket_owners

if TYPE_CHECKING:
    from specops.pipeline.run import Run

SERVER_JOB = "vllm-server"


@dataclass(frozen=True)
class Holder:
    """The process listening on a port, and the specops job it belongs to when it is one."""

    pid: int | None       # None: the socket's owner is not visible to this user
    command: str
    job: str | None       # SPECOPS_JOB_ID of its environment
    workdir: str | None   # SPECOPS_WORKDIR of its environment
    run: str | None       # the job's run, from the job's record in that workdir
    name: str | None      # the job's name (vllm-server, ...)

    def server_record(self) -> dict[str, Any] | None:
        """The job record of the specops server job this is ({} when unreadable); None when it is none."""
        if self.job is None or self.name != SERVER_JOB or self.workdir is None:
            return None
        return sharing.job_record(self.workdir, self.job)

    def is_server_of(self, run: str, workdir: str) -> bool:
        return (self.job is not None and self.name == SERVER_JOB and self.run == run
                and self.workdir is not None and os.path.realpath(self.workdir) == os.path.realpath(workdir))

    def describe(self) -> str:
        if self.pid is None:
            return "a process this user cannot see (another user's)"
        shown = self.command if len(self.command) <= 80 else self.command[:77] + "..."
        if self.job is None:
            return f"pid {self.pid} ({shown}), not a specops job"
        what = f"vLLM server job {self.job}" if self.name == SERVER_JOB else f"job {self.job}"
        return f"{what} of run {self.run!r} (workdir {self.workdir}, pid {self.pid})"

    def how_to_free(self) -> str:
        if self.pid is None:
            return "ask its owner to stop it"
        if self.job is None:
            return f"end it (kill {self.pid})"
        return f"stop it (invoke stop --job {self.job}, on the host of workdir {self.workdir})"


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def port_holder(port: int) -> Holder | None:
    """Who listens on TCP `port` of this host (any address), None when nobody does."""
    inodes = listening_inodes(port)
    if not inodes:
        return None
    pids = sorted(int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit())
    owners = socket_owners(pids, inodes)
    if not owners:
        return Holder(None, "?", None, None, None, None)
    # the oldest owner: a server's API process before the workers it forked with the socket inherited
    pid = owners[0]
    environ = _environ(pid)
    job, workdir = environ.get("SPECOPS_JOB_ID"), environ.get("SPECOPS_WORKDIR")
    record = sharing.job_record(workdir, job) if job and workdir else {}
    return Holder(pid, _command(pid), job, workdir, record.get("run"), record.get("name"))


def refuse_held_port(run: Run, port: int, workdir: str | os.PathLike[str], *, setting: str | None = None,
                     wanted: dict[str, Any] | None = None, captures: bool = False, later: Sequence[str] = ()) -> None:
    """BadInput (one line, exit 2) when `port` is held by anything but this run's own server job (which the
    run reuses, or replaces, itself) or another run's server that fits this run (vllm/sharing.py: it is
    used as it is). `wanted`: the server signature the step asks for; without it (the launch boundary,
    before any step) the keys every server of the run shares (sharing.RUN_WIDE), and with `captures` (the
    run's first server captures hidden states) its layer ids: another run's kept server that answers with
    its draft, or captures other layers, is found here rather than at the step. At the launch boundary a
    server another run kept for the next run on this target passes whatever it serves (the run uses it or
    stops it: vllm/handover.py), and one of a run that still owns it is refused when the run needs the
    port or the GPUs after its first server (`later`: what does), not hours later at that step. `setting`:
    what moves the port (default: the run config's vllm.port)."""
    holder = port_holder(port)
    if holder is None or holder.is_server_of(run.paths.name, str(workdir)):
        return
    differences: list[str] = []
    still_owned = ""
    if holder.job is not None and holder.name == SERVER_JOB:
        if wanted is not None:
            differences = sharing.borrow(holder, wanted, run.paths.run_dir)[1]
        else:
            record = sharing.job_record(holder.workdir or "", holder.job)
            recorded = (record.get("meta") or {}).get("server")
            if kept_for(run, record):
                return
            keys = (*sharing.RUN_WIDE, "layer_ids") if captures else sharing.RUN_WIDE
            differences = sharing.misfit(recorded, run_wide(run, captures=captures), keys)
            if not differences and later:
                still_owned = (f", which this run would use, but its later steps ({'; '.join(later)}) need the "
                               f"port or the GPUs while run {holder.run!r} still owns the server (a server kept "
                               "with vllm.keep_server is the next run's to stop)")
        if not differences and not still_owned:
            return
    moves = setting or f"set vllm.port in {run.label} to a free port"
    misfit = f", which does not fit this run (its {', '.join(differences)} differ)" if differences else still_owned
    raise BadInput(f"{run.label}: vllm.port: port {port} is held by {holder.describe()}{misfit}; "
                   f"{holder.how_to_free()} or {moves}")


def run_wide(run: Run, *, captures: bool = False) -> dict[str, Any]:
    """What every server this run starts records alike (sharing.RUN_WIDE), read without a load or a write;
    with `captures`, the layer ids its capturing server records too (a generating server records none)."""
    from specops.pipeline.run import model_digest, tokenizer_digest
    from specops.pipeline.vllm.command import choose_serve_python

    values: dict[str, Any] = {
        "model_digest": model_digest(run.model_path), "tokenizer_digest": tokenizer_digest(run.model_path),
        "serve_args": list(run.config.vllm.serve_args), "trust_remote_code": bool(run.config.trust_remote_code),
        "vllm_program": str(choose_serve_python(None).parent / "vllm")}
    if captures:
        values["layer_ids"] = list(run.layer_ids())
    return values


def serves(run: Run, backend: str) -> bool:
    """Whether a run with this backend starts a vLLM server at all (a step served by vLLM, or training
    online), so that its port matters before it starts."""
    config = run.config
    return (backend == "vllm" or config.hidden_states.mode != "offline"
            or (config.regenerate.enabled and config.regenerate.backend == "vllm")
            or (config.evaluate.enabled and config.evaluate.backend == "vllm") or config.parity.serve is True)


def check_before_run(run: Run, backend: str, workdir: str | os.PathLike[str], *, rank: int = 0,
                     later: Sequence[str] = ()) -> None:
    """The launch boundary's check (run check, the pipeline before its first step): a run that will serve
    finds its port held before anything is written or loaded (BadInput, one line). Node `rank` of a run
    across hosts serves on vllm.port + rank. `later`: what needs the port or the GPUs after the run's
    first server (pipeline.plan.later_needs)."""
    if serves(run, backend):
        refuse_held_port(run, run.config.vllm.port + rank, workdir, captures=first_server_captures(run, backend),
                         later=later)


def kept_for(run: Run, record: dict[str, Any]) -> bool:
    """A server job (its record) that another run kept for the next run on this run's target and serve
    settings (sharing.RUN_WIDE): this run may use it, and stop it when it needs the port or the GPUs."""
    return sharing.is_kept(record) and not sharing.misfit((record.get("meta") or {}).get("server"), run_wide(run),
                                                          sharing.RUN_WIDE)


def live_server(run: Run, backend: str) -> dict[str, Any] | None:
    """The specops vLLM server on the run's port, as the run's first server would find it: {"job", "run",
    "workdir", "fits" (it serves the run's first load as it is), "kept" (left for the next run on this
    target: the run stops it if it does not fit, vllm/handover.py)}; None when the port holds no specops
    server. For `plan`: a load a live server saves is not counted."""
    holder = port_holder(run.config.vllm.port)
    record = holder.server_record() if holder is not None else None
    if record is None:
        return None
    captures = first_server_captures(run, backend)
    keys = (*sharing.RUN_WIDE, "layer_ids") if captures else sharing.RUN_WIDE
    recorded = (record.get("meta") or {}).get("server")
    return {"job": holder.job, "run": holder.run, "workdir": holder.workdir,
            "fits": not sharing.misfit(recorded, run_wide(run, captures=captures), keys),
            "kept": kept_for(run, record)}


def first_server_captures(run: Run, backend: str) -> bool:
    """Whether the first server this run starts captures hidden states (extraction through vLLM, or
    training online; regenerate on vLLM shares that server), so that the layer ids matter at launch."""
    return backend == "vllm" or run.config.hidden_states.mode != "offline"
