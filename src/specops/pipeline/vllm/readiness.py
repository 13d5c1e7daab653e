"""The vLLM server's readiness gate, and which process answers on a port.

The server runs in its own process group (the API process, the engine core and its workers): ending
only the API process would orphan the others, which hold the model's memory. `wait_ready` is the
gate before any request: it polls GET /v1/models on 127.0.0.1 while checking that the group is
alive and that the port is held by a process of that group (so a stale server of another run
answering on the same port is never taken for ours), reports load progress from the log, and fails
at once, with the log's tail, when the group dies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from specops.jobs import processes
from specops.jobs.serverlog import load_stage

DEFAULT_READY_TIMEOUT_S = 1800.0  # real loads of a large target take ~18 min
TAIL_LINES = 40
HEARTBEAT_S = 30.0  # a load that stays at one milestone is still said to be loading, with its time


# ---------------------------------------------------------------------------------------------
# Which process answers on a port


def group_pids(pgid: int, *, running: bool = False) -> list[int]:
    """Processes whose process group is pgid (from /proc/<pid>/stat); `running`: zombies left out."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and fields[2] == str(pgid) and not (running and fields[0] in ("Z", "X")):
            pids.append(int(entry.name))
    return sorted(pids)


def listening_inodes(port: int) -> set[int]:
    """Socket inodes listening on TCP `port` (IPv4 and IPv6), from /proc/net/tcp{,6}."""
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cells = line.split()
            if len(cells) < 10 or cells[3] != "0A":  # 0A = LISTEN
                continue
            if int(cells[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(cells[9]))
    return inodes


def socket_owners(pids: list[int], inodes: set[int]) -> list[int]:
    """Those of pids holding one of the socket inodes open."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    owners = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    owners.append(pid)
                    break
            except OSError:
                continue
    return owners


def port_owner(port: int, pgid: int) -> dict[str, Any]:
    """{"listening": bool, "ours": bool, "pids": [pids of the group holding the listening socket]}."""
    inodes = listening_inodes(port)
    owners = socket_owners(group_pids(pgid), inodes) if inodes else []
    return {"listening": bool(inodes), "ours": bool(owners), "pids": owners}


# ---------------------------------------------------------------------------------------------
# The readiness gate


def log_tail(log: Path | None, lines: int = TAIL_LINES) -> list[str]:
    if log is None:
        return []
    try:
        with log.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 256 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    return [line.rstrip() for line in text.replace("\r", "\n").split("\n") if line.strip()][-lines:]


def _progress_line(log: Path | None) -> str | None:
    tail = log_tail(log, 1)
    return tail[-1][-300:] if tail else None


def served_models(port: int, timeout_s: float) -> list[str] | None:
    """Model ids served on 127.0.0.1:port, None when nothing (or nothing ready) answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=timeout_s) as response:
            if response.status != 200:
                return None
            document = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return [str(item.get("id")) for item in document.get("data", []) if isinstance(item, dict)]


def wait_ready(port: int, pgid: int, *, log: Path | None = None, timeout_s: float = DEFAULT_READY_TIMEOUT_S,
               poll_s: float = 1.0, foreign_grace_s: float = 30.0, progress: Any = None) -> dict[str, Any]:
    """Wait until the server of process group `pgid` answers GET /v1/models on 127.0.0.1:port.

    Ready means: the group is alive, a process of the group holds the listening socket of `port`,
    and /v1/models lists at least one model. Returns {"ok": True, "ready": True, "seconds",
    "models", "pids", ...} then. Fails (ok False, with "error" and the log's last lines in "log_tail")
    as soon as the group has no process left, or when another process group holds the port while
    ours is still loading for longer than `foreign_grace_s`, or after `timeout_s`.
    `progress(line)` (default: print "vllm: LINE" to stderr, the job log) gets the load's progress: each new
    milestone of vLLM's own log (serverlog.load_stage: weights read, KV cache, compile/graph capture,
    engine ready) with the seconds elapsed, the same again every HEARTBEAT_S, and "ready in N s".
    """
    report = progress or (lambda line: print(f"vllm: {line}", file=sys.stderr, flush=True))
    started = time.monotonic()
    seen_line = None
    shown: tuple[str | None, float] = ("", started)  # the load stage last reported, and when ("": none yet)
    foreign_since: float | None = None

    def failure(error: str) -> dict[str, Any]:
        return {"ok": False, "ready": False, "error": error, "port": port, "pgid": pgid,
                "seconds": round(time.monotonic() - started, 2), "log": str(log) if log else None,
                "log_tail": log_tail(log)}

    def alive() -> bool:
        # A zombie leader still answers killpg(0) until its parent reaps it: it counts as dead.
        return processes.group_alive(pgid) and bool(group_pids(pgid, running=True))

    while True:
        if not alive():
            return failure(f"the vLLM server (process group {pgid}) ended before it was ready")
        owner = port_owner(port, pgid)
        if owner["ours"]:
            foreign_since = None
            models = served_models(port, timeout_s=max(poll_s, 2.0))
            if models and alive():
                report(f"ready in {time.monotonic() - started:.0f} s")
                return {"ok": True, "ready": True, "port": port, "pgid": pgid, "pids": owner["pids"],
                        "models": models, "seconds": round(time.monotonic() - started, 2),
                        "log": str(log) if log else None}
        elif owner["listening"]:
            # Someone else holds the port: our server cannot bind it and will die, or is about to
            # take over from a server that is shutting down. Either way, give it a short grace.
            foreign_since = foreign_since or time.monotonic()
            if time.monotonic() - foreign_since > foreign_grace_s:
                return failure(f"port {port} is held by a process outside process group {pgid}: "
                               "another server answers there")
        seen_line = _progress_line(log) or seen_line
        stage = load_stage(log) if log is not None else None
        now = time.monotonic()
        if stage != shown[0] or now - shown[1] >= HEARTBEAT_S:  # a new milestone, or still at one
            shown = (stage, now)
            report(f"loading, {now - started:.0f} s: {stage or 'starting'}")
        elapsed = time.monotonic() - started
        if elapsed >= timeout_s:
            last = f" (last log line: {seen_line})" if seen_line else ""
            return failure(f"the vLLM server (process group {pgid}) was not ready on port {port} "
                           f"after {timeout_s:.0f} s{last}")
        time.sleep(min(poll_s, max(timeout_s - elapsed, 0.05)))


# ---------------------------------------------------------------------------------------------
# Running a server directly (tests, `specops vllm serve`); under tmux the job system does this.


def start_server(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start the server as the leader of a new process group, stdout and stderr into `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as handle:
        return subprocess.Popen(argv, env={**os.environ, **env}, stdout=handle, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def stop_server(pgid: int, grace_s: float = 20.0) -> str | None:
    """End the whole process group (API server, engine core, workers); the signal that ended it."""
    return processes.terminate_group(pgid, grace_s)
