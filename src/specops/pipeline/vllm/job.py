"""The run's `vllm-server` job: found (and reused) or launched, then waited on until it is ready.

`start_server_job` runs inside the `extract` job (or the pipeline job), once the extraction plan
says there is work for a server (a real target takes ~18 min to load):

1. a `vllm-server` job of this run that is pending or running, whose recorded server signature
   (model and its digest, layer ids, dtype, trust_remote_code, serve args, vLLM version, port, ...)
   equals the one wanted now, is reused; one whose signature differs is stopped (its whole process
   group) and replaced;
2. otherwise a new `vllm-server` job is launched: the `vllm serve` argv and env of
   command.build_serve_command, run by the jobs layer in its own tmux session and process group
   (so it outlives this extract job and the next extract reuses it); the signature goes into the job
   record's meta;
3. readiness.wait_ready gates the requests (load progress to stderr; a server that dies fails
   the step at once, with its log's tail).

The extraction client (extraction.vllm) then sends the rows; the command's end stops the job unless
the run keeps it (vllm.keep_server: lifetime.serving), so a next step run by hand reuses it only when the
run asks. `find_endpoint` is how the fidelity check finds the same job's server.

The serve env's interpreter comes from the caller (`serve_python`), else from SPECOPS_SERVE_PYTHON
(set by the control side from the inventory's `envs.serve`), else this interpreter.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specops.contract.errors import BadInput, CheckFailed
from specops.contract.progress import speaker
from specops.contract.protocol import ACTIVE_STATES
from specops.contract.protocol import JobRecord as Record
from specops.host.paths import workdir
from specops.jobs import launching, liveness, processes, records, stopping
from specops.jobs.tmux import TmuxServer
from specops.pipeline.run import Run, model_digest, tokenizer_digest
from specops.pipeline.vllm import handover, sharing
from specops.pipeline.vllm.captures import sweep_stopped
from specops.pipeline.vllm.command import (
    SERVE_PYTHON_ENV,
    build_serve_command,
    choose_serve_python,
    serve_dtype,
    serve_env_version,
    staging_dir,
)
from specops.pipeline.vllm.ports import port_holder, refuse_held_port
from specops.pipeline.vllm.readiness import port_owner, served_models, wait_ready

SERVER_JOB = "vllm-server"
STOP_GRACE_S = 20.0
# A CPU host serves the demo model: vLLM's CPU default sizes the KV cache from total memory (tens of
# GB); extraction requests (max_tokens=1) need a few MB. An explicit setting in the environment wins.
CPU_KVCACHE_GIB = "1"
_RECORD_WAIT_S = 10.0
_POLL_S = 0.1


say = speaker("extract")  # progress lines for people (specops.contract.progress)


def server_signature(run: Run, argv: list[str], host_gpus: int, port: int, version: str | None) -> dict[str, Any]:
    """What decides whether a running server can serve this run's extraction: equal or not reused."""
    return {"model": str(run.model_path), "model_digest": model_digest(run.model_path),
            "tokenizer_digest": tokenizer_digest(run.model_path), "layer_ids": run.layer_ids(),
            "dtype": serve_dtype(run, host_gpus),
            "trust_remote_code": bool(run.config.trust_remote_code), "serve_args": list(run.config.vllm.serve_args),
            "vllm_version": version, "port": port,
            "tensor_parallel": _flag_value(argv, "--tensor-parallel-size"),
            "data_parallel": _flag_value(argv, "--data-parallel-size") or "1",
            "staging": str(staging_dir(run)), "vllm_program": argv[0],
            # the connector the server writes through (left out for file: servers recorded before it was a key)
            **({"hidden_states_backend": run.config.hidden_states.backend}
               if run.config.hidden_states.backend != "file" else {})}


def _flag_value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def signature_differences(recorded: dict[str, Any] | None, wanted: dict[str, Any]) -> list[str]:
    """Keys whose values differ ('recorded' may come from an older specops, or be missing)."""
    if not isinstance(recorded, dict):
        return ["signature (none recorded)"]
    return sorted(key for key in set(recorded) | set(wanted) if recorded.get(key) != wanted.get(key))


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


def stop_job(record: Record, server: TmuxServer, why: str) -> str | None:
    """Stop a server job of this workdir once nobody else uses it (its lease: another run may be mid-step)."""
    sharing.hold(workdir(), record["id"], f"stopping it: {why}")
    try:
        say(f"stopping vLLM server job {record['id']}: {why}")
        outcome = stopping.stop(record, STOP_GRACE_S, server)
        if swept := sweep_stopped(record):
            say(swept)
    finally:
        sharing.release(workdir(), record["id"])
    return outcome.signal


def borrowable(run: Run, signature: dict[str, Any]) -> sharing.Borrowed | None:
    """Another run's server on the wanted port that fits this run (vllm/sharing.py), taken for this
    process (its lease) and still alive; None when the port holds none (a misfit is refused later)."""
    holder = port_holder(signature["port"])
    if holder is None or holder.is_server_of(run.paths.name, str(workdir())):
        return None
    borrowed, _ = sharing.borrow(holder, signature, run.paths.run_dir)
    if borrowed is None:
        return None
    sharing.hold(borrowed.workdir, borrowed.record["id"], f"run {run.paths.name} ({workdir()})")
    record = sharing.job_record(borrowed.workdir, borrowed.record["id"])  # after the wait: still there?
    if record.get("state") in ACTIVE_STATES and liveness.processes_alive(record):
        return sharing.Borrowed(record, borrowed.workdir, borrowed.run)
    sharing.release(borrowed.workdir, borrowed.record["id"])
    return None


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
            stop_job(current, server, why)
        # another run's server kept for the next run on this target: this run's now, stopped to make room
        handover.take_over(run, signature["port"], f"run {run.paths.name} needs port {signature['port']} for a "
                                                   "server of its own")
        # anything else on the port (another run's server that does not fit, a foreign process): one line
        refuse_held_port(run, signature["port"], workdir(), wanted=signature)
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


@dataclass
class ServerJob:
    """A ready extraction server of a run: its job record and how it came to be."""

    record: Record
    reused: bool
    port: int
    version: str
    ready: dict[str, Any]
    tmux: TmuxServer
    borrowed: sharing.Borrowed | None = None  # another run's server (another workdir's job), used as it is

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def staging(self) -> Path | None:
        """Where this server writes its captures (its own signature's: a borrowed server's is its owner's)."""
        staging = ((self.record.get("meta") or {}).get("server") or {}).get("staging")
        return Path(staging) if staging else None

    @property
    def served_model(self) -> str | None:
        """The model name clients send: the server's own (a borrowed server's path is its owner's)."""
        models = self.ready.get("models") or []
        return models[0] if models else None

    def stop(self, why: str) -> str:
        if self.borrowed is not None:
            return f"left running: it is run {self.borrowed.run}'s (workdir {self.borrowed.workdir})"
        return stop_job(records.load(self.record["id"]), self.tmux, why) or "already ended"

    def describe(self, stopped: str | None) -> dict[str, Any]:
        return {"job": self.record["id"], "reused": self.reused, "port": self.port, "vllm_version": self.version,
                "ready_s": self.ready["seconds"], "pgid": self.record["pgid"], "log": self.record["log"],
                "stopped": stopped, **({"owner": self.borrowed.describe()} if self.borrowed else {})}


def start_server_job(run: Run, gpus: int, *, port: int | None = None,
                     serve_python: str | os.PathLike[str] | None = None,
                     ready_timeout_s: float = 1800.0, visible_gpus: tuple[int, ...] | None = None,
                     memory_share: float | None = None, listen: str | None = None,
                     served_name: str | None = None) -> ServerJob:
    """This run's ready extraction `vllm-server` job (reused or launched). Raises CheckFailed with the
    server's log tail when it dies or does not get ready, BadInput for a missing serve env.

    visible_gpus  only these GPUs (CUDA_VISIBLE_DEVICES): the server's share of a split host
    memory_share  vLLM's --gpu-memory-utilization: a lower share leaves room for a trainer beside it
    listen        the address it listens on (default 127.0.0.1: its clients run on this host); a role split's
                  serve host listens where the train host reaches it
    served_name   the model name it serves under (default: the target's path here); a role split's trainer
                  asks by its own path to the target (speculators checks the served name against it)
    All go into the job record's signature (meta.server.placement, the argv), so a server placed otherwise is
    replaced."""
    argv, env, signature, version = extraction_command(run, gpus, port=port, serve_python=serve_python,
                                                       visible_gpus=visible_gpus, memory_share=memory_share,
                                                       listen=listen, served_name=served_name)
    return start_job(run, argv, env, signature, version, ready_timeout_s=ready_timeout_s,
                     same="same model, layer ids, dtype, serve args and vLLM version", serves=EXTRACTION_SERVES)


EXTRACTION_SERVES = "the target, capturing hidden states"


def extraction_command(run: Run, gpus: int, *, port: int | None = None,
                       serve_python: str | os.PathLike[str] | None = None,
                       visible_gpus: tuple[int, ...] | None = None,
                       memory_share: float | None = None, listen: str | None = None,
                       served_name: str | None = None) -> tuple[list[str], dict[str, str], dict[str, Any], str]:
    """(argv, env, signature, vLLM version) of the run's extraction server (see start_server_job)."""
    python, version = serve_env(serve_python)
    chosen_port = port or run.config.vllm.port
    serving_gpus = len(visible_gpus) if visible_gpus is not None else gpus
    argv, env = build_serve_command(run, serving_gpus, chosen_port, workdir(), serve_python=python,
                                    vllm_version=version)
    if listen is not None:
        argv[argv.index("--host") + 1] = listen
    if served_name is not None:  # before the run's own serve args, which come last in argv and win
        at = argv.index("serve") + 2
        argv[at:at] = ["--served-model-name", served_name]
    placement: dict[str, Any] = {}
    if visible_gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, visible_gpus))
        placement["gpus"] = list(visible_gpus)
    if memory_share is not None:
        # before the run's own serve args, which come last in argv and win
        at = argv.index("serve") + 2
        argv[at:at] = ["--gpu-memory-utilization", repr(float(memory_share))]
        placement["memory_share"] = memory_share
    if serving_gpus == 0 and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        env["VLLM_CPU_KVCACHE_SPACE"] = CPU_KVCACHE_GIB
    signature = server_signature(run, argv, serving_gpus, chosen_port, version)
    if placement:
        signature["placement"] = placement
    return argv, env, signature, version


def launch_ahead(run: Run, gpus: int, regenerate_backend: str) -> str | None:
    """Launch the run's extraction server job without waiting for it, so that it loads while CPU work
    (prepare) runs; extract then finds it (the same signature) and waits only for what is left of the
    load. Only where extract will need it: the run extracts, regenerate did not already start it, and no
    extraction is recorded done (a rerun whose files are whole would not use it: a load thrown away).
    `regenerate_backend`: the run's effective settings' (the engine's). Returns the job's id, or None when
    nothing was launched."""
    from specops.pipeline.run import Manifest

    config = run.config
    if not config.hidden_states.extracts or config.hidden_states.mode != "offline":
        return None
    if config.regenerate.enabled and regenerate_backend == "vllm":
        return None  # regenerate loaded it already
    if (Manifest(run.paths.run_dir).record("extract") or {}).get("status") == "done":
        return None
    argv, env, signature, version = extraction_command(run, gpus)
    holder = port_holder(signature["port"])
    if holder is not None and not holder.is_server_of(run.paths.name, str(workdir())):
        borrowed, _ = sharing.borrow(holder, signature, run.paths.run_dir)
        if borrowed is not None:  # extract uses it as it is: nothing to load
            say(f"vLLM server job {borrowed.record['id']} of run {borrowed.run} (workdir {borrowed.workdir}) fits "
                "this run: extract will use it, nothing launched ahead")
            return None
    record, reused = find_or_launch(run, signature, argv, env, TmuxServer(workdir()))
    if not reused:
        say(f"started vLLM server job {record['id']} ahead of extract (run {run.paths.name}, vLLM {version}): "
            f"it loads while prepare runs; log {record['log']}")
    return record["id"]


def serve_env(serve_python: str | os.PathLike[str] | None = None) -> tuple[Path, str]:
    """(the serve env's interpreter, its vLLM version); BadInput when it has no vLLM."""
    python = choose_serve_python(serve_python)
    version = serve_env_version(python)
    if version is None:
        raise BadInput(f"{SERVE_PYTHON_ENV}: no vLLM is installed in the serve env of {python} (inventory envs.serve)")
    return python, version


def start_job(run: Run, argv: list[str], env: dict[str, str], signature: dict[str, Any], version: str, *,
              ready_timeout_s: float = 1800.0, same: str = "same signature", serves: str | None = None) -> ServerJob:
    """The run's `vllm-server` job serving `argv` (any server: extraction, generation, a speculator),
    reused when its recorded signature equals `signature` (which holds the port), else (re)launched;
    returned once it is ready."""
    chosen_port = signature["port"]
    server = TmuxServer(workdir())
    borrowed = None
    if launching.running_job(SERVER_JOB, run.paths.name, server) is None:
        borrowed = borrowable(run, signature)  # another run's server that fits: no load at all
    if borrowed is not None:
        record, reused = borrowed.record, True
        say(f"reusing vLLM server job {record['id']} of run {borrowed.run} (workdir {borrowed.workdir}, port "
            f"{chosen_port}, vLLM {version}): it fits run {run.paths.name} (the same weights, tokenizer and "
            "serve settings); it stays up after this step")
    else:
        record, reused = find_or_launch(run, signature, argv, env, server)
        sharing.hold(workdir(), record["id"], f"run {run.paths.name} ({workdir()})")
        if reused:
            say(f"reusing vLLM server job {record['id']} (run {run.paths.name}, port {chosen_port}, "
                f"vLLM {version}): {same}")
        else:
            say(f"started vLLM server job {record['id']} (run {run.paths.name}, port {chosen_port}, "
                f"vLLM {version}); log {record['log']}")
    if not record.get("pgid"):
        ended = _ended_record(record["id"], server)
        raise CheckFailed(f"vLLM server job {record['id']} did not start: {ended.get('error') or ended['state']} "
                          f"(log {ended['log']})")

    ready = wait_ready(chosen_port, record["pgid"], log=Path(record["log"]), timeout_s=ready_timeout_s)
    if not ready["ok"] and borrowed is not None:
        raise CheckFailed(f"vLLM server job {record['id']} of run {borrowed.run} (workdir {borrowed.workdir}): "
                          f"{ready['error']} (log {record['log']})")
    if not ready["ok"]:
        if processes.group_alive(record["pgid"]):  # not ready in time, or a foreign port holder: do not leave it
            stop_job(records.load(record["id"]), server, "it did not get ready")
        raise CheckFailed(_death_report(record, ready, server))
    say(f"vLLM server ready in {ready['seconds']} s (job {record['id']}, pids {ready['pids']})")
    # what the summary counts as a load (lifetime.server_loads); a borrowed server is its owner's load
    if borrowed is None and "ready_s" not in (record.get("meta") or {}):
        # from the job's start: a server launched ahead (launch_ahead) loaded before this wait began
        began = records.parse_iso(record.get("started") or record["created"]).timestamp()
        noted = {"serves": serves or same, "ready_s": round(max(time.time() - began, ready["seconds"]), 2)}
        # a new meta dict: records.update saves only a record that differs from its shallow copy
        records.update(record["id"], lambda current: current.update(meta={**current.get("meta", {}), **noted}))
    return ServerJob(record, reused, chosen_port, version, ready, server, borrowed)


def stop_running(run: Run, why: str) -> str | None:
    """Stop this run's server job if one is pending or running: the signal that ended it, "already
    ended", or None when there was none."""
    server = TmuxServer(workdir())
    current = launching.running_job(SERVER_JOB, run.paths.name, server)
    return (stop_job(current, server, why) or "already ended") if current else None


def find_endpoint(run: Run, backend: str) -> tuple[str | None, str | None, str]:
    """(endpoint, staging, why): this run's running `vllm-server` job whose port answers, else (None, None, why).

    The job is found as start_server_job finds it (the jobs layer's records and liveness); its
    recorded signature must name this run's model, its process group must hold the port, and
    /v1/models must answer. `backend`: the run's (its effective settings'): only a vllm run borrows another's.
    """
    record = launching.running_job(SERVER_JOB, run.paths.name, TmuxServer(workdir()))
    owner = workdir()
    if record is None:
        borrowed = _borrowed_extraction_server(run, backend)
        if borrowed is None:
            return None, None, f"no running {SERVER_JOB} job of run {run.paths.name}"
        record, owner = borrowed.record, borrowed.workdir
    signature = (record.get("meta") or {}).get("server") or {}
    port = signature.get("port")
    sharing.hold(owner, record["id"], f"run {run.paths.name} ({workdir()}), the fidelity check")
    # another run's server (same weights, tokenizer and layers) names its owner's path
    if owner == workdir() and signature.get("model") != str(run.model_path):
        return None, None, f"{SERVER_JOB} job {record['id']} serves {signature.get('model')!r}, not {run.model_path}"
    if not isinstance(port, int) or not record.get("pgid") or not liveness.processes_alive(record):
        return None, None, f"{SERVER_JOB} job {record['id']} has no live process group or no recorded port"
    if not port_owner(port, int(record["pgid"]))["ours"]:
        return None, None, f"{SERVER_JOB} job {record['id']} does not hold port {port} (still loading?)"
    if not served_models(port, 5.0):
        return None, None, f"{SERVER_JOB} job {record['id']}: port {port} does not answer /v1/models"
    return (f"http://127.0.0.1:{port}/v1", signature.get("staging"),
            f"{SERVER_JOB} job {record['id']} on port {port}")


def _borrowed_extraction_server(run: Run, backend: str) -> sharing.Borrowed | None:
    """Another run's extraction server on this run's port that captured what this run's files hold: the same
    weights, tokenizer and layer ids. Only for a run that extracts through vLLM (`backend`: the run's effective
    settings'; its own server would be one)."""
    if backend != "vllm":
        return None
    holder = port_holder(run.config.vllm.port)
    record = holder.server_record() if holder is not None else None
    if record is None:
        return None
    recorded = (record.get("meta") or {}).get("server") or {}
    wanted = {"model_digest": model_digest(run.model_path), "tokenizer_digest": tokenizer_digest(run.model_path),
              "layer_ids": run.layer_ids()}
    if any(recorded.get(key) != value for key, value in wanted.items()):
        return None
    return sharing.Borrowed(record, holder.workdir, str(record.get("run")))
