"""Online and hybrid training (`hidden_states.mode`): the trainer asks the run's vLLM server for the
hidden states of rows that have no file on disk, and two watches run beside it.

speculators 0.9 does the asking itself (`speculators train --vllm-endpoint E --on-missing generate`):
the server writes each row's states to its staging folder, the trainer loads and deletes the file.
specops decides where the server and the trainer run (`Placement`), keeps the server job up through
the training, and watches, once a `WATCH_PERIOD_S`:

- the server job: its process group and its hold on the port. speculators' own bounds (request
  timeout, retries, circuit breaker) take minutes on a dead server; the watch stops the trainer at
  once and the step fails with one line naming the server job;
- the disk: every byte under the run's hidden-state folder and the server's staging folder, against
  `disk_budget_gb`; over it, the trainer is stopped and the step fails naming both figures. The peak
  seen goes into the step's report and `online.json` (status reads it).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput
from specops.contract.protocol import TRAINER_ONLINE
from specops.host import atomic

if TYPE_CHECKING:
    from specops.pipeline.run import Run

WATCH_PERIOD_S = 0.25
SERVER_EVERY = 4  # samples between two looks at the server job (one a second)
STATE_PERIOD_S = 2.0  # the server's counters are asked and online.json written this often
LOG_PERIOD_S = 10.0  # the server's side goes into the job log this often
DEFAULT_SHARE = 0.5  # shared without a plan: half of each GPU for the server
STATE_FILE = "online.json"  # <run>/online.json: the watches' figures while training


@dataclass(frozen=True)
class Placement:
    """Where the server and the trainer run on one host: GPU indices (empty on a CPU host)."""

    kind: str  # cpu | split | shared
    server_gpus: tuple[int, ...] = ()
    trainer_gpus: tuple[int, ...] = ()
    server_memory_share: float | None = None  # shared: vLLM's --gpu-memory-utilization
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "server_gpus": list(self.server_gpus), "trainer_gpus": list(self.trainer_gpus),
                "server_memory_share": self.server_memory_share, "reason": self.reason}


def choose_placement(kind: str | None, host_gpus: int, planned: dict[str, Any] | None = None, *,
                     server_gpus: int | None = None, memory_share: float | None = None,
                     label: str = "run config") -> Placement:
    """GPU indices for the server and the trainer on one host.

    kind, server_gpus, memory_share  the run config's hidden_states.placement / server_gpus /
                     server_memory_share: they win over the plan
    planned          the plan's placement for the run's mode (specops.planning: "kind", "server_gpus",
                     "server": {"gpu_memory_utilization"}); None (no target config to plan from): split when
                     one server GPU leaves the trainer some, else shared at half the memory
    """
    if host_gpus == 0:
        return Placement("cpu", reason="a CPU host: server and trainer share the cores")
    planned = planned or {}
    planned_kind = planned.get("kind") if planned.get("kind") in ("split", "shared") else None
    chosen = kind or planned_kind or ("split" if host_gpus > 1 else "shared")
    why = (f"hidden_states.placement: {kind} ({label})" if kind
           else f"the plan: {planned.get('why')}" if planned_kind else "no plan: one server GPU, the trainer the rest")
    every = tuple(range(host_gpus))
    if chosen == "split":
        wanted = server_gpus or (planned.get("server_gpus") if planned_kind == "split" else None) or 1
        if wanted >= host_gpus:
            raise BadInput(f"{label}: hidden_states.server_gpus: {wanted} leaves none of the host's {host_gpus} "
                           "GPUs for the trainer; use placement shared or fewer server GPUs")
        return Placement("split", every[:wanted], every[wanted:], None, why)
    share = memory_share or ((planned.get("server") or {}).get("gpu_memory_utilization")
                             if planned_kind == "shared" else None) or DEFAULT_SHARE
    return Placement("shared", every, every, share, why)


def visible(gpus: tuple[int, ...]) -> str:
    return ",".join(map(str, gpus))


@dataclass
class Watch:
    """The server job's liveness and the hidden-state bytes on disk, sampled while the trainer runs."""

    folders: tuple[Path, ...]
    budget: int | None  # bytes
    server_alive: Any  # () -> str | None: None while alive, else why it is not
    state_file: Path | None = None
    period_s: float = WATCH_PERIOD_S
    counters: Any = None  # () -> {"finished", "running", "waiting"} | None: the server's request counters
    server_job: str | None = None
    trainer_pid: int | None = None  # set when the trainer starts (its failure line names it)
    peak_bytes: int = 0
    bytes_now: int = 0
    samples: int = 0
    reason: str | None = None  # why the trainer was stopped
    served: float = 0.0  # requests the server finished since the training started
    served_per_s: float | None = None
    busy_samples: int = 0  # counter samples with a request in the server
    counter_samples: int = 0
    _logged_at: float = 0.0
    _first: tuple[float, float] | None = None  # (time, finished) at the first counter sample
    _last: tuple[float, float] | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample_server(self) -> None:
        """The server's counters: served since the start, its rate over the last window, how often busy."""
        reading = self.counters() if self.counters else None
        if reading is None:
            return
        now = time.monotonic()
        if self._first is None:
            self._first = (now, reading["finished"])
        if self._last is not None and now > self._last[0]:
            self.served_per_s = round((reading["finished"] - self._last[1]) / (now - self._last[0]), 2)
        self._last = (now, reading["finished"])
        self.served = reading["finished"] - self._first[1]
        self.counter_samples += 1
        self.busy_samples += int(reading["running"] + reading["waiting"] > 0)

    def sample(self) -> str | None:
        """One look: the bytes now (the peak kept), then the server; a reason to stop, or None."""
        from specops.pipeline.extraction import bytes_on_disk

        now = bytes_on_disk(self.folders)
        self.bytes_now = now
        self.peak_bytes = max(self.peak_bytes, now)
        self.samples += 1
        if self.budget is not None and now > self.budget:
            return (f"hidden states on disk: {now} bytes in {', '.join(map(str, self.folders))} exceed "
                    f"hidden_states.disk_budget_gb ({self.budget} bytes)")
        # the server's liveness reads /proc for its group: once a second is bound enough
        return self.server_alive() if self.samples % SERVER_EVERY == 1 else None

    def start(self, stop_trainer: Callable[[], None]) -> None:
        def loop() -> None:
            last_write = 0.0
            while not self._stop.is_set():
                reason = self.sample()
                if reason and self.reason is None:
                    self.reason = reason
                    stop_trainer()
                if time.monotonic() - last_write > STATE_PERIOD_S:
                    last_write = time.monotonic()
                    self.sample_server()
                    self.write_state()
                self._stop.wait(self.period_s)

        self._thread = threading.Thread(target=loop, name="online-watch", daemon=True)
        self._thread.start()

    def pending_line(self) -> str | None:
        """The server's side for the job log (the training view shows it beside the trainer's bar),
        at most once a LOG_PERIOD_S, once the counters have been read."""
        now = time.monotonic()
        if self.counter_samples == 0 or now - self._logged_at < LOG_PERIOD_S:
            return None
        self._logged_at = now
        server = self.as_dict()["server"]
        return TRAINER_ONLINE + json.dumps({**server, "bytes": self.bytes_now, "budget_bytes": self.budget}) + "\n"

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for folder in self.folders:
            orphan_locks_removed(folder)
        self.write_state("ended")

    def write_state(self, state: str = "running") -> None:
        if self.state_file is not None:
            atomic.write_json(self.state_file, {"state": state, **self.as_dict()})

    def as_dict(self) -> dict[str, Any]:
        busy = round(self.busy_samples / self.counter_samples, 3) if self.counter_samples else None
        return {"bytes": self.bytes_now, "peak_bytes": self.peak_bytes, "budget_bytes": self.budget,
                "samples": self.samples, "folders": [str(folder) for folder in self.folders],
                "stopped_because": self.reason, "updated_at": time.time(),
                "server": {"job": self.server_job, "served": self.served, "served_per_s": self.served_per_s,
                           "busy_share": busy}}


def orphan_locks_removed(folder: Path) -> int:
    """Remove the server's `.lock` files whose states file is gone and which nobody holds. vLLM's hidden-states
    connector writes FILE and FILE.lock; the trainer's reader removes the lock once it may load, but a read that
    timed out on a loaded machine (hs_connectors waits 10 s) leaves it behind after the file is loaded and deleted.
    The staging folder is the server's and the trainer's only: empty when the training is done."""
    import fcntl

    removed = 0
    for lock in folder.glob("*.lock") if folder.is_dir() else ():
        if lock.with_suffix("").exists():
            continue  # its states are still to be read
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a writer still holding it: not an orphan
        except BlockingIOError:
            continue
        finally:
            os.close(fd)
        lock.unlink(missing_ok=True)
        removed += 1
    return removed


def read_state(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def ended_how(code: int, pid: int | None) -> str:
    """The trainer's end in words: its exit status, or the signal that killed it."""
    who = f"the trainer (speculators train{f', pid {pid}' if pid else ''})"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"{who} was killed by {name}"
    return f"{who} exited with status {code}"


def placement_for(run: Run, host_gpus: int, planned: dict[str, Any] | None = None) -> Placement:
    """The run's placement on this host: the run config's choices over the plan's (`planned`)."""
    settings = run.config.hidden_states
    return choose_placement(settings.placement, host_gpus, planned, server_gpus=settings.server_gpus,
                            memory_share=settings.server_memory_share, label=run.label)


@dataclass
class Serving:
    """The run's ready server job for a training, and the watch beside the trainer."""

    server: Any  # vllm.ServerJob
    placement: Placement
    watch: Watch

    def describe(self) -> dict[str, Any]:
        return {**self.server.describe(None), "endpoint": self.server.endpoint}

    def trainer_env(self) -> dict[str, str]:
        if self.placement.kind == "split":
            return {"CUDA_VISIBLE_DEVICES": visible(self.placement.trainer_gpus)}
        return {}

    def server_problem(self) -> str | None:
        """None while the server job's processes hold its port, else one line naming the job."""
        from specops.jobs import processes
        from specops.pipeline.vllm import port_owner

        record = self.server.record
        pgid = record.get("pgid")
        if not processes.group_alive(pgid):
            return f"vLLM server job {record['id']} died during training (its process group {pgid} is gone)"
        if not port_owner(self.server.port, int(pgid))["ours"]:
            return (f"vLLM server job {record['id']} died during training (it no longer holds port "
                    f"{self.server.port})")
        return None

    def failure(self, code: int, pid: int | None, log: Path) -> str:
        """The step's one line when the trainer did not finish: what died, and what to do."""
        resume = "run the same command to resume from the newest checkpoint"
        if self.watch.reason:
            return f"{self.watch.reason}; specops stopped the trainer; {resume} (log: {log})"
        if reason := self.server_problem():  # the trainer noticed first (speculators' own bounds)
            return f"{reason}; {ended_how(code, pid)}; {resume} (log: {log})"
        return f"{ended_how(code, pid)}; {resume} (log: {log})"


def serve(run: Run, placement: Placement) -> Serving:
    """Find or launch the run's vllm-server job where the placement says, clear the staging folder of
    files no trainer will load (a killed trainer leaves its last ones), and check the budget holds
    what is on disk already with room for the files in flight."""
    from specops.pipeline import vllm
    from specops.pipeline.extraction import budget_bytes, bytes_on_disk

    settings = run.config.hidden_states
    budget = budget_bytes(settings.disk_budget_gb)
    staging = vllm.staging_dir(run)
    folders = (run.paths.hidden_states, staging)
    if staging.is_dir():
        for stale in staging.iterdir():
            if stale.is_file():
                stale.unlink(missing_ok=True)
    if budget is not None and (present := bytes_on_disk(folders)) > budget:
        raise BadInput(f"{run.label}: hidden_states.disk_budget_gb: {present} bytes of hidden states are on disk "
                       f"already in {run.paths.hidden_states}, over the budget of {budget} bytes")
    gpus = placement.server_gpus if placement.kind == "split" else None
    server = vllm.start_server_job(run, len(placement.server_gpus), visible_gpus=gpus,
                                   memory_share=placement.server_memory_share)
    from specops.pipeline.vllm import request_counters

    if server.staging is not None:  # where this server writes: another run's server that fits writes in its own
        folders = (run.paths.hidden_states, server.staging)
    watch = Watch(folders, budget, lambda: None, run.paths.run_dir / STATE_FILE,
                  counters=lambda: request_counters(server.port), server_job=server.record["id"])
    serving = Serving(server, placement, watch)
    watch.server_alive = serving.server_problem
    return serving
