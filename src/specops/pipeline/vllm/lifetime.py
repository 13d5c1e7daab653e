"""A pipeline's servers: how many it loaded and how long each load took, and the end of their lifetime.

A load is counted from the job records (the truth about jobs on the host): every `vllm-server` job of
the run created since the pipeline began is one load; its record's meta says what it served and how
many seconds it took to get ready (start_job writes both). The run's last server is stopped with the
run's last step unless the run config asks it to stay (`vllm.keep_server`, for a next run on the same
target to reuse, vllm/sharing.py): `true` until stopped by hand, an idle timeout (`30m`) until unused that
long (vllm/keeper.py). A server left behind unasked holds the GPUs' memory and the port.
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
    """After the run's last step: its server stopped (unless vllm.keep_server), and the loads it made. A
    kept server is marked so (meta.keep: its owner run, its idle timeout) and, with an idle timeout, watched
    by a `vllm-keeper` job that stops it once unused that long (vllm/keeper.py)."""
    from specops.pipeline.vllm.job import stop_running

    keep = run.config.vllm.keep_server
    kept = keep is not False
    stopped = None if kept else stop_running(run, "the run's last step is done (vllm.keep_server: false)")
    servers: dict[str, Any] = {**server_loads(run, since), "stopped": stopped, "kept": kept}
    if kept:
        servers["keeper"] = keep_server(run, None if keep is True else int(keep))
    return servers


def keep_server(run: Run, idle_s: int | None) -> dict[str, Any] | None:
    """Mark the run's running server kept (and launch its watch when it has an idle timeout); None when the
    run has no server running."""
    import sys

    from specops.host.paths import workdir
    from specops.jobs import launching
    from specops.jobs.tmux import TmuxServer
    from specops.pipeline.vllm.keeper import KEEPER_JOB

    server = TmuxServer(workdir())
    current = launching.running_job(SERVER_JOB, run.paths.name, server)
    if current is None:
        return None
    keep = {"owner_run": run.paths.name, "idle_s": idle_s, "since": records.now_iso()}
    records.update(current["id"], lambda record: record.update(meta={**(record.get("meta") or {}), "keep": keep}))
    if idle_s is None:
        return {"server": current["id"], "idle_s": None, "job": None}
    watching = launching.running_job(KEEPER_JOB, run.paths.name, server)
    if watching is not None:  # an earlier pipeline's watch of another server: this one replaces it
        from specops.jobs import stopping

        stopping.stop(watching, 5.0, server)
    record = launching.launch(name=KEEPER_JOB, run=run.paths.name, revision=None, env={},
                              argv=[sys.executable, "-m", "specops.pipeline.vllm.keeper", current["id"], str(idle_s)],
                              meta={"server": current["id"], "idle_s": idle_s})
    return {"server": current["id"], "idle_s": idle_s, "job": record["id"]}
