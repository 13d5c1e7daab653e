"""A `vllm-server` job of the run that generates: the target alone, or with an EAGLE-3 draft.

regenerate asks the target for answers; evaluate asks it with the draft as its speculator
(`--speculative-config {"method":"eagle3","model":DRAFT,"num_speculative_tokens":k}`) and without
it (tokens/s without speculation). The job is the run's one `vllm-server` job (vllm_pipeline's
find-or-launch): the same signature reuses a live server, a different one (the extraction server,
another draft) stops it and starts this one.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from specops.errors import BadInput, CheckFailed
from specops.paths import workdir

READY_TIMEOUT_S = 1800.0


def say(message: str) -> None:
    print(f"vllm: {message}", file=sys.stderr, flush=True)


def eagle3_config(draft: Path, tokens: int) -> dict[str, Any]:
    return {"method": "eagle3", "model": str(draft), "num_speculative_tokens": tokens}


def serve_env_source(python: Path, relative: str) -> str | None:
    """The text of a file of the serve env's site-packages (its interpreter says where; nothing imported)."""
    import subprocess

    try:
        done = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        return (Path(done.stdout.strip()) / relative).read_text(errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return None


def per_request_metrics_supported(python: Path) -> bool:
    """vLLM serves per-request spec-decode metrics (`--per-request-spec-decode-metrics`, newer builds)."""
    source = serve_env_source(python, "vllm/engine/arg_utils.py")
    return bool(source and "per-request-spec-decode-metrics" in source)


def build_generate_command(run: Any, host_gpus: int, port: int, python: Path, version: str | None,
                           speculative: dict[str, Any] | None = None) -> tuple[list[str], dict[str, str]]:
    """`vllm serve` argv and env additions for a generating server (no hidden-state extraction)."""
    from specops.pipeline.vllm_pipeline import CPU_KVCACHE_GIB
    from specops.pipeline.vllm_server import needs_scale_out, serve_dtype

    argv = [str(python.parent / "vllm"), "serve", str(run.model_path), "--host", "127.0.0.1", "--port", str(port),
            "--dtype", serve_dtype(run, host_gpus), "--tensor-parallel-size", str(max(host_gpus, 1))]
    if speculative is not None:
        argv += ["--speculative-config", json.dumps(speculative, separators=(",", ":"))]
        if per_request_metrics_supported(python):
            argv += ["--per-request-spec-decode-metrics", "summary"]
    if run.config.trust_remote_code:
        argv.append("--trust-remote-code")
    if needs_scale_out(version):
        argv.append("--enable-scale-out")
    if host_gpus == 0:
        argv.append("--enforce-eager")
    argv += list(run.config.vllm.serve_args)
    root = workdir()
    env = {"TMPDIR": str(root / "tmp" / "vllm"), "VLLM_CACHE_ROOT": str(root / "cache" / "vllm")}
    for folder in env.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    if run.model_path.is_dir():
        env["HF_HUB_OFFLINE"] = "1"
    if host_gpus == 0 and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        env["VLLM_CPU_KVCACHE_SPACE"] = CPU_KVCACHE_GIB
    return argv, env


def _draft_digest(draft: Path) -> str:
    from specops.pipeline.fingerprint import file_digest

    weights = draft / "model.safetensors"
    return file_digest(weights) if weights.is_file() else "none"


def generating_server(run: Any, *, speculative: dict[str, Any] | None = None, port: int | None = None,
                      serve_python: str | None = None, ready_timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
    """Reuse or launch the run's server job for generation and wait until it answers.

    Returns {"job", "reused", "port", "endpoint", "pgid", "vllm_version", "ready_s", "log"}.
    """
    from specops.jobs import processes, records
    from specops.jobs.tmux import TmuxServer
    from specops.pipeline.fingerprint import model_digest
    from specops.pipeline.runs import visible_gpus
    from specops.pipeline.vllm_pipeline import _death_report, _ended_record, _stop, choose_serve_python, find_or_launch
    from specops.pipeline.vllm_server import serve_env_version, wait_ready

    gpus = visible_gpus()
    python = choose_serve_python(serve_python)
    version = serve_env_version(python)
    if version is None:
        raise BadInput(f"SPECOPS_SERVE_PYTHON: no vLLM is installed in the serve env of {python} "
                       "(inventory envs.serve)")
    chosen_port = port or run.config.vllm.port
    argv, env = build_generate_command(run, gpus, chosen_port, python, version, speculative)
    signature = {"purpose": "generate", "model": str(run.model_path), "model_digest": model_digest(run.model_path),
                 "speculative": speculative,
                 "draft_digest": _draft_digest(Path(speculative["model"])) if speculative else None,
                 "serve_args": list(run.config.vllm.serve_args), "trust_remote_code": run.config.trust_remote_code,
                 "vllm_version": version, "port": chosen_port, "tensor_parallel": max(gpus, 1),
                 "vllm_program": argv[0], "argv": argv}
    server = TmuxServer(workdir())
    record, reused = find_or_launch(run, signature, argv, env, server)
    say(("reusing" if reused else "started") + f" vLLM server job {record['id']} (port {chosen_port}, vLLM {version}"
        + (f", draft {speculative['model']}" if speculative else ", target alone") + ")")
    if not record.get("pgid"):
        ended = _ended_record(record["id"], server)
        raise CheckFailed(f"vLLM server job {record['id']} did not start: {ended.get('error') or ended['state']} "
                          f"(log {ended['log']})")
    ready = wait_ready(chosen_port, record["pgid"], log=Path(record["log"]), timeout_s=ready_timeout_s)
    if not ready["ok"]:
        if processes.group_alive(record["pgid"]):
            _stop(records.load(record["id"]), server, "it did not get ready")
        raise CheckFailed(_death_report(record, ready, server))
    return {"job": record["id"], "reused": reused, "port": chosen_port, "endpoint": f"http://127.0.0.1:{chosen_port}",
            "pgid": record["pgid"], "vllm_version": version, "ready_s": ready["seconds"], "log": record["log"],
            "model": ready["models"][0] if ready.get("models") else str(run.model_path)}


def stop_generating_server(run: Any, job_id: str, why: str) -> str | None:
    from specops.jobs import records
    from specops.jobs.tmux import TmuxServer
    from specops.pipeline.vllm_pipeline import _stop

    return _stop(records.load(job_id), TmuxServer(workdir()), why) or "already ended"
