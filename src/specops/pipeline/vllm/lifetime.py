"""A run's servers: how many it loaded and how long each load took, and the end of their lifetime.

A load is counted from the job records (the truth about jobs on the host): every `vllm-server` job of
the run created since the command began is one load; its record's meta says what it served and how
many seconds it took to get ready (start_job writes both).

ONE rule ends a server's life, for every command that enters the engine (the pipeline, `step X` alone
with evaluate's --reproduce and --sweep, `step parity`; a detached job is the same command in a job):
`serving(run, what)` is held around the command's work, and when the work ends, however it ends (done,
failed, an unexpected error, SIGTERM from `job stop`, Ctrl-C), the run's server is stopped unless the run
config asks it to stay (`vllm.keep_server`, for a next step or run on the same target to reuse,
vllm/sharing.py): `true` until stopped by hand, an idle timeout (`30m`) until unused that long
(vllm/keeper.py). The servers are separate jobs so that a kept one can outlive the command; nothing else
decides to leave one behind. A server left behind unasked holds the GPUs' memory and the port.
(A step killed with SIGKILL runs no code: `invoke stop` sends SIGTERM first, and `invoke stop --run R`
stops the run's services itself after its steps.)
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from specops.contract.progress import speaker
from specops.jobs import records

if TYPE_CHECKING:
    from specops.pipeline.run import Run

SERVER_JOB = "vllm-server"
STOPPED_EXIT = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM

say = speaker("vllm")


class Stopped(BaseException):
    """SIGTERM arrived (`job stop`): not an Exception, so that no step's `except Exception` swallows it."""


def _stopped(signum: int, _frame: Any) -> None:
    signal.signal(signum, signal.SIG_DFL)  # a second SIGTERM during the clean-up ends the process
    raise Stopped


@contextmanager
def serving(run: Run, what: str) -> Iterator[dict[str, Any]]:
    """Around a command's work (`what`: "the pipeline", "step evaluate"): yields a dict that, once the work
    ended (whatever way), holds end_of_run's account (the loads made meanwhile, the server stopped or kept).
    SIGTERM during the work ends it through here (exit 143 after the clean-up)."""
    since, ended = time.time(), dict[str, Any]()
    handled = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stopped) if handled else None
    outcome = "is done"
    try:
        yield ended
    except Stopped:
        outcome = "was stopped"
        raise SystemExit(STOPPED_EXIT) from None
    except BaseException:
        outcome = "failed"
        raise
    finally:
        if handled:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if outcome == "was stopped" else previous)
        ended.update(end_of_run(run, since, f"{what} {outcome}"))
        if ended["starts"]:
            say(f"vLLM server loads: {ended['starts']}, {ended['seconds_loading']} s loading"
                + (f"; the last one stopped ({ended['stopped']})" if ended["stopped"] else ""))


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


def end_of_run(run: Run, since: float, why: str = "the run's last step is done") -> dict[str, Any]:
    """When a command's work ended (`why`, in words): the run's server stopped (unless vllm.keep_server),
    and the loads it made. A kept server is marked so (meta.keep: its owner run, its idle timeout) and,
    with an idle timeout, watched by a `vllm-keeper` job that stops it once unused that long
    (vllm/keeper.py); one line on stderr says which server stays, for how long, and how to stop it."""
    from specops.pipeline.vllm.job import stop_running

    keep = run.config.vllm.keep_server
    kept = keep is not False
    stopped = None if kept else stop_running(run, f"{why} (vllm.keep_server: false)")
    servers: dict[str, Any] = {**server_loads(run, since), "stopped": stopped, "kept": kept}
    if kept:
        servers["keeper"] = keeper = keep_server(run, None if keep is True else int(keep))
        if keeper is not None:
            servers["stays"] = stays = stays_line(run, keeper)
            say(stays)
    return servers


def stays_line(run: Run, keeper: dict[str, Any]) -> str:
    """What a user reads of a kept server: which, for how long, and how to stop it."""
    idle_s = keeper["idle_s"]
    how_long = ("until stopped by hand (vllm.keep_server: true)" if idle_s is None
                else f"until unused for {_duration(idle_s)} (vllm.keep_server; watched by job {keeper['job']})")
    return (f"vLLM server job {keeper['server']} of run {run.paths.name} stays up {how_long}; stop it now with "
            f"`invoke stop --run {run.paths.name} --job {keeper['server']}`")


def _duration(seconds: float) -> str:
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s")


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
    marked = (current.get("meta") or {}).get("keep")
    watching = launching.running_job(KEEPER_JOB, run.paths.name, server)
    if (isinstance(marked, dict) and not marked.get("stopped") and marked.get("idle_s") == idle_s
            and (idle_s is None or (watching is not None
                                    and (watching.get("meta") or {}).get("server") == current["id"]))):
        # kept already, as asked (an earlier step of the run): its watch counts the idle time from its last use
        return {"server": current["id"], "idle_s": idle_s, "job": watching["id"] if idle_s is not None and watching
                else None}
    keep = {"owner_run": run.paths.name, "idle_s": idle_s, "since": records.now_iso()}
    records.update(current["id"], lambda record: record.update(meta={**(record.get("meta") or {}), "keep": keep}))
    if idle_s is None:
        return {"server": current["id"], "idle_s": None, "job": None}
    if watching is not None:  # an earlier command's watch of another server: this one replaces it
        from specops.jobs import stopping

        stopping.stop(watching, 5.0, server)
    record = launching.launch(name=KEEPER_JOB, run=run.paths.name, revision=None, env={},
                              argv=[sys.executable, "-m", "specops.pipeline.vllm.keeper", current["id"], str(idle_s)],
                              meta={"server": current["id"], "idle_s": idle_s})
    return {"server": current["id"], "idle_s": idle_s, "job": record["id"]}
