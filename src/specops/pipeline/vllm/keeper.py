"""A kept server's stated lifetime: `vllm.keep_server: 30m` keeps the run's last server up for the next run
on the target, and stops it once nobody has used it for 30 minutes.

The watch is a job of its own on the host (`vllm-keeper`, a service of the run like the server itself),
launched by the pipeline's end (lifetime.end_of_run) and run as `python -m specops.pipeline.vllm.keeper JOB
IDLE_S`. Not "the next specops command on the host reaps it": a kept server holds the GPUs' memory, and a
host nobody comes back to would hold it for ever; the watch needs nothing from the workstation, shows in
`invoke status`, and its log says when and why it stopped the server.

Used means: a request running or waiting, a request finished since the last look (the server's own
/metrics counters), or a run holding the server's lease (vllm/sharing.py: a borrower between its requests,
a step that found it and is about to ask). At the deadline the watch takes the lease itself, without
waiting (a user that took it meanwhile keeps the server up), and stops the server's process group. The
record of the server job changes only when its use does (meta.keep.in_use, and meta.keep.last_used when
a use ends), so that `invoke status` shows "in use" or the time left, computed on the host
(jobs.liveness).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from specops.contract.protocol import ACTIVE_STATES
from specops.host.paths import workdir
from specops.jobs import liveness, records, stopping
from specops.jobs.tmux import TmuxServer
from specops.pipeline.vllm import sharing
from specops.pipeline.vllm.captures import sweep_stopped
from specops.pipeline.vllm.counters import request_counters

KEEPER_JOB = "vllm-keeper"
STOP_GRACE_S = 20.0


def poll_seconds(idle_s: float) -> float:
    """Look often enough that the stop comes within a twentieth of the timeout (1 s .. 30 s)."""
    return min(30.0, max(1.0, idle_s / 20))


def _note(job: str, keep: dict[str, Any]) -> None:
    records.update(job, lambda current: current.update(meta={**(current.get("meta") or {}),
                                                               "keep": {**(current.get("meta") or {}).get("keep", {}),
                                                                        **keep}}))


def _used(job: str, port: int, before: dict[str, float] | None) -> tuple[bool, dict[str, float] | None]:
    counts = request_counters(port)
    busy = sharing.in_use(workdir(), job)
    if counts is not None:
        busy = busy or counts["running"] > 0 or counts["waiting"] > 0
        busy = busy or (before is not None and counts["finished"] != before["finished"])
    return busy, counts if counts is not None else before


def watch(job: str, idle_s: float) -> str:
    """Watch server job `job` of this workdir until it ends or has been idle `idle_s` seconds; then stop it.
    Returns what happened, in words."""
    server = TmuxServer(workdir())
    record = records.load(job)
    port = int(((record.get("meta") or {}).get("server") or {})["port"])
    last_used, was_busy = time.time(), False
    _note(job, {"idle_s": idle_s, "last_used": last_used, "in_use": False})
    counts = request_counters(port)
    while True:
        time.sleep(poll_seconds(idle_s))
        record = liveness.refresh(records.load(job), server)
        if record["state"] not in ACTIVE_STATES or not liveness.processes_alive(record):
            return f"vLLM server job {job} ended ({record['state']}): nothing to stop"
        busy, counts = _used(job, port, counts)
        if busy:
            last_used = time.time()
            if not was_busy:
                _note(job, {"in_use": True})
            was_busy = True
            continue
        if was_busy:  # the use ended at the last busy look: the countdown starts from there
            _note(job, {"in_use": False, "last_used": last_used})
            was_busy = False
        if time.time() - last_used < idle_s:
            continue
        if not sharing.hold(workdir(), job, f"{KEEPER_JOB}: the idle timeout", wait_s=0):
            continue  # taken meanwhile: in use again
        why = f"unused for {round(time.time() - last_used)} s (vllm.keep_server: {idle_s:g} s idle)"
        print(f"specops: stopping vLLM server job {job}: {why}", file=sys.stderr, flush=True)
        outcome = stopping.stop(record, STOP_GRACE_S, server)
        if swept := sweep_stopped(record):
            print(f"specops: {swept}", file=sys.stderr, flush=True)
        _note(job, {"stopped": records.now_iso(), "why": why})
        sharing.release(workdir(), job)
        return f"stopped vLLM server job {job} ({outcome.signal or 'already ended'}): {why}"


def main(argv: list[str]) -> int:
    job, idle_s = argv[0], float(argv[1])
    print(f"specops: keeping vLLM server job {job} while used; it stops after {idle_s:g} s unused",
          file=sys.stderr, flush=True)
    print(f"specops: {watch(job, idle_s)}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
