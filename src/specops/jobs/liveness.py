"""What a job's state really is now, and the derived fields a status table shows.

A record that says pending/running is only believed while its tmux session exists. Once the
session is gone and no exit was recorded, nobody is left to record one: the job is `lost`, and
that is persisted. The check re-reads the record under the lock after seeing the session gone,
because the wrapper records the exit before its session closes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from specops.contract.protocol import ACTIVE_STATES, JobRecord, JobState
from specops.jobs import logtail, processes, records
from specops.jobs.tmux import TmuxServer


def refresh(record: JobRecord, server: TmuxServer) -> JobRecord:
    if record["state"] not in ACTIVE_STATES or server.has_session(record["tmux_session"]):
        return record

    def mark_lost(current: JobRecord) -> None:
        # Checked again under the lock: a launch holds it until its session exists.
        if current["state"] in ACTIVE_STATES and not server.has_session(current["tmux_session"]):
            current["state"] = JobState.LOST
            current["lost_at"] = records.now_iso()

    return records.update(record["id"], mark_lost)


def processes_alive(record: JobRecord) -> bool:
    return processes.group_alive(record.get("pgid"), record.get("boot_id"))


def describe(record: JobRecord, server: TmuxServer) -> dict[str, Any]:
    """The record, refreshed, plus age, liveness of its processes and its last log line."""
    record = refresh(record, server)
    age = datetime.now(UTC) - records.parse_iso(record["created"])
    return {
        **record,
        "age_s": round(age.total_seconds(), 1),
        "processes_alive": processes_alive(record),
        "last_log_line": logtail.last_line(Path(record["log"])),
        # an ended job's own result (a failure's reason), not whatever its log ended with
        "result": None if record["state"] in ACTIVE_STATES else logtail.result_line(Path(record["log"])),
        # a note is about the job while it runs ("waiting for job ... to end"), not once it has ended
        "note": specops_note(Path(record["log"])) if record["state"] in ACTIVE_STATES else None,
        "progress": step_progress(record),
    }


_NOTE_PREFIX = "specops: "
_NOTE_HEAD_BYTES = 1 << 18


def specops_note(log: Path) -> str | None:
    """The latest line specops itself wrote near the start of a job's log (e.g. "resuming from
    epoch 3"): what a person wants to see in `status` while a tool's own output scrolls past."""
    try:
        with log.open("rb") as handle:
            head = handle.read(_NOTE_HEAD_BYTES).decode(errors="replace")
    except OSError:
        return None
    notes = [line[len(_NOTE_PREFIX):] for line in head.splitlines() if line.startswith(_NOTE_PREFIX)]
    return notes[-1][:300] if notes else None


def step_progress(record: JobRecord) -> dict[str, Any] | None:
    """An extraction's progress file (samples/s, tokens/s, ETA), when the job is one; an evaluation's
    (drafts scored of those to score) while an evaluate or pipeline job is evaluating."""
    if record.get("name") == "vllm-server" and record["state"] in ACTIVE_STATES \
            and "ready_s" not in (record.get("meta") or {}):
        return server_load(record)
    if record.get("name") == "vllm-server" and record["state"] in ACTIVE_STATES \
            and (record.get("meta") or {}).get("keep"):
        return kept_server(record["meta"]["keep"])
    if not record.get("run"):
        return None
    import json

    from specops.host import paths

    if record.get("name") in ("train", "pipeline"):
        online = online_progress(paths.workdir() / "runs" / record["run"])
        if online is not None:
            return online
    if record.get("name") in ("pipeline", "prepare", "regenerate", "extract"):  # the steps that may answer first
        answering = _running(paths.workdir() / "runs" / record["run"] / "regenerated" / "progress.json")
        if answering is not None:
            return answering
    if record.get("name") in ("evaluate", "pipeline"):
        evaluation = paths.workdir() / "runs" / record["run"] / "evaluation" / "progress.json"
        try:
            document = json.loads(evaluation.read_text())
        except (OSError, ValueError):
            document = None
        if document and document.get("state") == "running":
            return document
    if record.get("name") != "extract":
        return None

    progress = paths.workdir() / "runs" / record["run"] / "hidden_states" / "progress.json"
    try:
        return json.loads(progress.read_text())
    except (OSError, ValueError):
        return None


def _running(path: Path, fresh_s: float = 300.0) -> dict[str, Any] | None:
    """A progress file that says it is running and was written lately (regenerate rewrites it every 10 s while
    it answers; one left "running" by a killed job is not believed)."""
    import json
    import time

    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or document.get("state") != "running":
        return None
    return document if time.time() - float(document.get("updated_at") or 0) < fresh_s else None


def server_load(record: JobRecord) -> dict[str, Any]:
    """A vLLM server still loading (no ready_s recorded yet): its latest milestone from its own log and the
    seconds since its job started, for `status`."""
    from specops.jobs.serverlog import load_stage

    since = record.get("started") or record["created"]
    elapsed = (datetime.now(UTC) - records.parse_iso(since)).total_seconds()
    return {"load": load_stage(Path(record["log"])) or "starting", "elapsed_s": round(elapsed, 1),
            "serves": (record.get("meta") or {}).get("serves")}


def kept_server(keep: dict[str, Any]) -> dict[str, Any]:
    """A server kept after its run (vllm.keep_server): its owner run and, with an idle timeout, the seconds
    left before its watch stops it (from the last use the watch recorded, on this host's clock; the whole
    timeout while it is in use)."""
    import time

    idle_s, last_used, in_use = keep.get("idle_s"), keep.get("last_used"), bool(keep.get("in_use"))
    left = (None if not isinstance(idle_s, int | float) else float(idle_s) if in_use
            else max(0.0, idle_s - (time.time() - last_used)) if isinstance(last_used, int | float) else None)
    return {"kept": {"owner_run": keep.get("owner_run"), "idle_s": idle_s, "in_use": in_use,
                     "idle_left_s": round(left, 1) if left is not None else None}}


_TRAIN_LOG_TAIL_BYTES = 16384


def online_progress(run_dir: Path) -> dict[str, Any] | None:
    """Server and trainer side by side while a run trains online or hybrid: hidden states the server
    serves per second (its own counters, sampled by the training's watch in online.json), the trainer's
    tokens per second and the share of each step it spent waiting for data (speculators'
    profile/fetch_frac, from the newest step line of train.log), and which one waits for the other."""
    import json

    from specops.contract.protocol import TRAINER_METRIC, WAITS_FOR_DATA

    try:
        state = json.loads((run_dir / "online.json").read_text())
    except (OSError, ValueError):
        return None
    if state.get("state") != "running":
        return None
    try:
        with (run_dir / "checkpoints" / "train.log").open("rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(handle.tell() - _TRAIN_LOG_TAIL_BYTES, 0))
            tail = handle.read().decode(errors="replace")
    except OSError:
        tail = ""
    metrics: dict[str, float] = {}
    for key, value in TRAINER_METRIC.findall(tail):  # later lines overwrite earlier ones: the newest step
        metrics[key] = float(value)
    fetch = metrics.get("profile/fetch_frac")
    server = state.get("server") or {}
    waits = None
    if fetch is not None:
        waits = "the trainer waits for the server" if fetch > WAITS_FOR_DATA else "the server waits for the trainer"
    return {"step": "train", "online": True, "server": server,
            "trainer": {"tokens_per_s": metrics.get("profile/tokens_per_s"), "fetch_frac": fetch,
                        "epoch": metrics.get("epoch"), "global_step": metrics.get("global_step")},
            "waits": waits, "disk": {"bytes": state.get("bytes"), "peak_bytes": state.get("peak_bytes"),
                                     "budget_bytes": state.get("budget_bytes")}}
