"""Step 2 with the `vllm` backend, end to end on the host: a `vllm-server` job, then the client.

`extract_with_server` runs inside the `extract` job (or the pipeline job):

1. nothing to do (the manifest says rows 0..N-1 are extracted from the same inputs, and their files
   are whole): no server is touched at all — a real target takes ~18 min to load;
2. a `vllm-server` job of this run that is pending or running, whose recorded server signature
   (model and its digest, layer ids, dtype, trust_remote_code, serve args, vLLM version, port, ...)
   equals the one wanted now, is reused; one whose signature differs is stopped (its whole process
   group) and replaced;
3. otherwise a new `vllm-server` job is launched: the `vllm serve` argv and env of
   vllm_server.build_serve_command, run by the jobs layer in its own tmux session and process group
   (so it outlives this extract job and the next extract reuses it); the signature goes into the job
   record's meta;
4. vllm_server.wait_ready gates the requests (load progress to stderr; a server that dies fails
   the step at once, with its log's tail);
5. extract_vllm.run_generate_offline sends the rows; the server job is stopped afterwards only
   when asked (`stop_server`), since the next extract would load the model again.

The serve env's interpreter comes from the caller (`serve_python`), else from SPECOPS_SERVE_PYTHON
(set by the control side from the inventory's `envs.serve`), else this interpreter.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from specops.errors import BadInput, CheckFailed
from specops.jobs import launching, liveness, processes, records, stopping
from specops.jobs.tmux import TmuxServer
from specops.paths import workdir
from specops.pipeline.config import Run
from specops.pipeline.runs import visible_gpus
from specops.protocol import ACTIVE_STATES
from specops.protocol import JobRecord as Record

SERVER_JOB = "vllm-server"
SERVE_PYTHON_ENV = "SPECOPS_SERVE_PYTHON"
STOP_GRACE_S = 20.0
# A CPU host serves the demo model: vLLM's CPU default sizes the KV cache from total memory (tens of
# GB); extraction requests (max_tokens=1) need a few MB. An explicit setting in the environment wins.
CPU_KVCACHE_GIB = "1"
_RECORD_WAIT_S = 10.0
_POLL_S = 0.1


def say(message: str) -> None:
    print(f"extract: {message}", file=sys.stderr, flush=True)


def choose_serve_python(serve_python: str | os.PathLike[str] | None) -> Path:
    chosen = serve_python or os.environ.get(SERVE_PYTHON_ENV) or sys.executable
    # abspath, not resolve(): a venv's python is a symlink whose target knows nothing of the venv
    path = Path(os.path.abspath(chosen))
    if not path.is_file():
        origin = "serve_python" if serve_python else SERVE_PYTHON_ENV if os.environ.get(SERVE_PYTHON_ENV) else "python"
        raise BadInput(f"{origin}: the serve env's interpreter {path} is not a file (inventory envs.serve)")
    return path




def server_signature(run: Run, argv: list[str], host_gpus: int, port: int, version: str | None) -> dict[str, Any]:
    """What decides whether a running server can serve this run's extraction: equal or not reused."""
    from specops.pipeline.fingerprint import model_digest
    from specops.pipeline.vllm_server import serve_dtype, staging_dir

    return {"model": str(run.model_path), "model_digest": model_digest(run.model_path),
            "layer_ids": run.layer_ids(), "dtype": serve_dtype(run, host_gpus),
            "trust_remote_code": bool(run.config.trust_remote_code), "serve_args": list(run.config.vllm.serve_args),
            "vllm_version": version, "port": port, "tensor_parallel": max(host_gpus, 1),
            "staging": str(staging_dir(run)), "vllm_program": argv[0]}


def signature_differences(recorded: dict[str, Any] | None, wanted: dict[str, Any]) -> list[str]:
    """Keys whose values differ ('recorded' may come from an older specops, or be missing)."""
    if not isinstance(recorded, dict):
        return ["signature (none recorded)"]
    return sorted(key for key in set(recorded) | set(wanted) if recorded.get(key) != wanted.get(key))


def _nothing_to_do(run: Run, samples: int | None, host_gpus: int) -> bool:
    """run_generate_offline's own skip decision, taken before any server is needed."""
    from specops.pipeline.extract_vllm import plan_extraction

    return plan_extraction(run, samples, host_gpus).unchanged


def _settled(job_id: str, server: TmuxServer) -> Record:
    """The record once the wrapper has a pgid or the job has ended (a loaded host may start it slowly)."""
    deadline = time.monotonic() + _RECORD_WAIT_S
    record = liveness.refresh(records.load(job_id), server)
    while not record.get("pgid") and record["state"] in ACTIVE_STATES and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        record = liveness.refresh(records.load(job_id), server)
    return record


def _ended_record(job_id: str, server: TmuxServer) -> Record:
    """The record after the wrapper recorded the exit (it does so just after the group dies)."""
    deadline = time.monotonic() + _RECORD_WAIT_S
    record = liveness.refresh(records.load(job_id), server)
    while record["state"] in ACTIVE_STATES and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        record = liveness.refresh(records.load(job_id), server)
    return record


def _port_holder(port: int, run_name: str, server: TmuxServer) -> Record | None:
    """A live vllm-server job of ANOTHER run on this port: ours could never bind it."""
    for record in reversed(records.all_records()):
        if record["name"] != SERVER_JOB or record["run"] == run_name:
            continue
        if (record.get("meta") or {}).get("server", {}).get("port") != port:
            continue
        if liveness.refresh(record, server)["state"] in ACTIVE_STATES and liveness.processes_alive(record):
            return record
    return None


def _stop(record: Record, server: TmuxServer, why: str) -> str | None:
    say(f"stopping vLLM server job {record['id']}: {why}")
    outcome = stopping.stop(record, STOP_GRACE_S, server)
    return outcome.signal


def find_or_launch(run: Run, signature: dict[str, Any], argv: list[str], env: dict[str, str],
                   server: TmuxServer) -> tuple[Record, bool]:
    """(the server job's record, reused?): a matching live server of this run, else a fresh job."""
    for _attempt in range(2):  # a second try only after losing a launch race to another process
        current = launching.running_job(SERVER_JOB, run.paths.name, server)
        if current is not None:
            recorded = (current.get("meta") or {}).get("server")
            differences = signature_differences(recorded, signature)
            if not differences:
                current = _settled(current["id"], server)  # one still starting has no pgid yet
                if liveness.processes_alive(current):
                    return current, True
            why = (f"its {', '.join(differences)} differ from run {run.paths.name}'s" if differences
                   else "its processes are gone")
            _stop(current, server, why)
        holder = _port_holder(signature["port"], run.paths.name, server)
        if holder is not None:
            raise CheckFailed(f"port {signature['port']} is taken by vLLM server job {holder['id']} of run "
                              f"{holder['run']!r}; stop it (invoke stop --job {holder['id']}) or pass --port")
        try:
            record = launching.launch(name=SERVER_JOB, run=run.paths.name, argv=argv, env=env, revision=None,
                                      meta={"server": signature})
        except launching.AlreadyRunning:
            continue
        return _settled(record["id"], server), False
    raise CheckFailed(f"could not launch a {SERVER_JOB} job for run {run.paths.name}: another one keeps starting")


def _death_report(record: Record, ready: dict[str, Any], server: TmuxServer) -> str:
    """Print the server's log tail to stderr (the job log); the one-line reason for the step's error."""
    ended = _ended_record(record["id"], server)
    tail = ready.get("log_tail") or []
    print(f"---- last {len(tail)} lines of the vLLM server log {ended['log']} ----", file=sys.stderr)
    for line in tail:
        print(f"  | {line}", file=sys.stderr)
    print("----", file=sys.stderr, flush=True)
    exit_code = ended.get("exit_code")
    how = f"; it {ended['state']} with exit code {exit_code}" if exit_code is not None else ""
    last = next((line for line in reversed(tail) if "error" in line.lower()), tail[-1] if tail else "")
    return (f"vLLM server job {record['id']}: {ready['error']}{how}"
            + (f"; last error line: {last.strip()[-300:]}" if last else "") + f" (log {ended['log']})")


def extract_with_server(run: Run, samples: int | None, *, stop_server: bool = False,
                        serve_python: str | os.PathLike[str] | None = None, ready_timeout_s: float = 1800.0,
                        port: int | None = None) -> dict[str, Any]:
    """Extract rows 0..N-1 with the vllm backend through this run's `vllm-server` job (reused or launched).

    run              the loaded run (its embedded model, if any, already generated)
    samples          N; None: the run's `samples`, else every prepared row
    stop_server      stop the server job afterwards (default: keep it for the next extract)
    serve_python     the serve env's interpreter (default: $SPECOPS_SERVE_PYTHON, else this one)
    ready_timeout_s  how long the server may take to load before the step fails
    port             where the server listens (default: the run's vllm.port)

    Returns extract_vllm.run_generate_offline's report (status, counts, layer_ids, backend "vllm",
    seconds, ...) plus "server": {job, reused, port, ready_s, stopped, ...}. Raises CheckFailed with
    the server's log tail when it dies or does not get ready, BadInput for a missing serve env.
    """
    from specops.pipeline.extract_vllm import run_generate_offline
    from specops.pipeline.vllm_server import build_serve_command, serve_env_version, wait_ready

    started = time.monotonic()
    gpus = visible_gpus()
    if _nothing_to_do(run, samples, gpus):
        from specops.pipeline.manifest import Manifest

        say("hidden states of these samples are already extracted from the same inputs; no server needed")
        stopped = None
        if stop_server:  # asked not to leave a server behind: one may still run from an earlier extract
            server = TmuxServer(workdir())
            current = launching.running_job(SERVER_JOB, run.paths.name, server)
            stopped = (_stop(current, server, "--stop-server") or "already ended") if current else None
        record = Manifest(run.paths.run_dir).record("extract") or {}
        return {"step": "extract", "status": "skipped: unchanged", "backend": "vllm",
                "inputs_hash": record.get("inputs_hash"), "counts": record.get("counts", {}),
                "layer_ids": run.layer_ids(), "server": {"stopped": stopped} if stopped else None}

    python = choose_serve_python(serve_python)
    version = serve_env_version(python)
    if version is None:
        raise BadInput(f"{SERVE_PYTHON_ENV}: no vLLM is installed in the serve env of {python} (inventory envs.serve)")
    chosen_port = port or run.config.vllm.port
    argv, env = build_serve_command(run, gpus, chosen_port, workdir(), serve_python=python, vllm_version=version)
    if gpus == 0 and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        env["VLLM_CPU_KVCACHE_SPACE"] = CPU_KVCACHE_GIB
    signature = server_signature(run, argv, gpus, chosen_port, version)
    server = TmuxServer(workdir())

    record, reused = find_or_launch(run, signature, argv, env, server)
    if reused:
        say(f"reusing vLLM server job {record['id']} (run {run.paths.name}, port {chosen_port}, vLLM {version}): "
            "same model, layer ids, dtype, serve args and vLLM version")
    else:
        say(f"started vLLM server job {record['id']} (run {run.paths.name}, port {chosen_port}, vLLM {version}); "
            f"log {record['log']}")
    if not record.get("pgid"):
        ended = _ended_record(record["id"], server)
        raise CheckFailed(f"vLLM server job {record['id']} did not start: {ended.get('error') or ended['state']} "
                          f"(log {ended['log']})")

    ready = wait_ready(chosen_port, record["pgid"], log=Path(record["log"]), timeout_s=ready_timeout_s)
    if not ready["ok"]:
        if processes.group_alive(record["pgid"]):  # not ready in time, or a foreign port holder: do not leave it
            _stop(records.load(record["id"]), server, "it did not get ready")
        raise CheckFailed(_death_report(record, ready, server))
    say(f"vLLM server ready in {ready['seconds']} s (job {record['id']}, pids {ready['pids']})")

    endpoint = f"http://127.0.0.1:{chosen_port}/v1"
    try:
        report = run_generate_offline(run, endpoint, samples, host_gpus=gpus)
    finally:
        stopped = None
        if stop_server:
            stopped = _stop(records.load(record["id"]), server, "--stop-server") or "already ended"
    report["server"] = {"job": record["id"], "reused": reused, "port": chosen_port, "vllm_version": version,
                        "ready_s": ready["seconds"], "pgid": record["pgid"], "log": record["log"],
                        "stopped": stopped}
    report["total_seconds"] = round(time.monotonic() - started, 2)
    return report
