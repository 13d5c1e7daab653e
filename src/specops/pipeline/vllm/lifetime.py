"""A pipeline's servers: how many it loaded and how long each load took, and the end of their lifetime.

A load is counted from the job records (the truth about jobs on the host): every `vllm-server` job of
the run created since the pipeline began is one load; its record's meta says what it served and how
many seconds it took to get ready (start_job writes both). The run's last server is stopped with the
run's last step unless the run config asks it to stay (`vllm.keep_server: true`, for a next run on the
same target to reuse): a server left behind holds the GPUs' memory and the port, and the next run on
the host fails on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specops.jobs import records

if TYPE_CHECKING:
    from specops.pipeline.run import Run

SERVER_JOB = "vllm-server"


def server_loads(run: Run, since: float) -> dict[str, Any]:
    """{"starts": N, "seconds_loading": S, "loads": [{"job", "serves", "ready_s"}...]} of the run's
    server jobs created at or after the epoch time `since`, oldest first."""
    loads = []
    for record in records.all_records():
        if record.get("name") != SERVER_JOB or record.get("run") != run.paths.name:
            continue
        try:
            created = records.parse_iso(record["created"]).timestamp()
        except (KeyError, ValueError):
            continue
        if created + 1.0 < since:  # ISO seconds: a second's grace
            continue
        meta = record.get("meta") or {}
        loads.append({"job": record["id"], "serves": meta.get("serves"), "ready_s": meta.get("ready_s"),
                      "created": record["created"]})
    loads.sort(key=lambda item: item["created"])
    return {"starts": len(loads), "seconds_loading": round(sum(item["ready_s"] or 0.0 for item in loads), 2),
            "loads": loads}


def end_of_run(run: Run, since: float) -> dict[str, Any]:
    """After the run's last step: its server stopped (unless vllm.keep_server), and the loads it made."""
    from specops.pipeline.vllm.job import stop_running

    kept = bool(run.config.vllm.keep_server)
    stopped = None if kept else stop_running(run, "the run's last step is done (vllm.keep_server: false)")
    return {**server_loads(run, since), "stopped": stopped, "kept": kept}
