"""A `vllm-server` job of the run that generates: the target alone, or with a speculator (a trained draft, or
vLLM's own training-free ngram or suffix).

regenerate asks the target for answers; evaluate asks it with the draft as its speculator
(`--speculative-config {"method":"eagle3","model":DRAFT,"num_speculative_tokens":k}`) and without
it (tokens/s without speculation). The job is the run's one `vllm-server` job (vllm_pipeline's
find-or-launch): the same signature reuses a live server, a different one (the extraction server,
another draft) stops it and starts this one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.progress import speaker
from specops.host.paths import workdir

if TYPE_CHECKING:
    from specops.pipeline.run import Run

READY_TIMEOUT_S = 1800.0


say = speaker("vllm")  # progress lines for people (specops.contract.progress)


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


def build_generate_command(run: Run, host_gpus: int, port: int, python: Path, version: str | None,
                           speculative: dict[str, Any] | None = None) -> tuple[list[str], dict[str, str]]:
    """`vllm serve` argv and env additions for a generating server (no hidden-state extraction)."""
    from specops.pipeline.vllm.command import (
        gpu_memory_bytes,
        needs_scale_out,
        one_process_engine,
        parallel_args,
        serve_dtype,
    )
    from specops.pipeline.vllm.job import CPU_KVCACHE_GIB

    # the run's vllm tensor x data parallel sizes, as for the extraction server
    sizes = run.parallel_sizes(host_gpus, gpu_memory_bytes())
    argv = [str(python.parent / "vllm"), "serve", str(run.model_path), "--host", "127.0.0.1", "--port", str(port),
            "--dtype", serve_dtype(run, host_gpus), *parallel_args(sizes)]
    if speculative is not None:
        argv += ["--speculative-config", json.dumps(speculative, separators=(",", ":"))]
        if per_request_metrics_supported(python):
            argv += ["--per-request-spec-decode-metrics", "summary"]
    if run.config.trust_remote_code:
        argv.append("--trust-remote-code")
    if needs_scale_out(version):
        argv.append("--enable-scale-out")
    from specops.pipeline.vllm.command import cpu_args, server_tmpdir, vllm_cache_root

    argv += cpu_args(run, host_gpus)
    argv += list(run.config.vllm.serve_args)
    root = workdir()

    env = {"TMPDIR": str(server_tmpdir(root)), "VLLM_CACHE_ROOT": str(vllm_cache_root(root))}
    for folder in env.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    if run.model_path.is_dir():
        env["HF_HUB_OFFLINE"] = "1"
    if host_gpus == 0 and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        env["VLLM_CPU_KVCACHE_SPACE"] = CPU_KVCACHE_GIB
    env.update(one_process_engine(host_gpus, sizes))
    return argv, env


def _draft_digest(draft: Path) -> str:
    """The draft as vLLM reads it: its weights and its config (the auxiliary layers, the flags)."""
    from specops.pipeline.run import file_digest

    parts = [file_digest(draft / name) if (draft / name).is_file() else "none"
             for name in ("model.safetensors", "config.json")]
    return ":".join(parts)


def generation_signature(run: Run, argv: list[str], speculative: dict[str, Any] | None, version: str | None,
                         port: int, gpus: int) -> dict[str, Any]:
    """What decides whether a running generating server can be reused: what vLLM serves, not where it was read
    from. A draft is its weights and config (a copy elsewhere serves the same), so its path is left out
    (CONTRIBUTING: which server-config keys matter)."""
    from specops.pipeline.run import model_digest, tokenizer_digest

    # a training-free speculator (ngram, suffix) has no draft: its method and settings are the whole of it
    draft = _draft_digest(Path(speculative["model"])) if speculative and speculative.get("model") else None
    shown = json.dumps(speculative, separators=(",", ":")) if speculative else None
    unplaced = ({**speculative, "model": draft} if draft else dict(speculative)) if speculative else None
    return {"purpose": "generate", "model": str(run.model_path), "model_digest": model_digest(run.model_path),
            "tokenizer_digest": tokenizer_digest(run.model_path), "speculative": unplaced, "draft_digest": draft,
            "serve_args": list(run.config.vllm.serve_args), "trust_remote_code": run.config.trust_remote_code,
            "vllm_version": version, "port": port, "tensor_parallel": max(gpus, 1), "vllm_program": argv[0],
            "argv": [json.dumps(unplaced, separators=(",", ":")) if arg == shown else arg for arg in argv]}


def generating_server(run: Run, *, speculative: dict[str, Any] | None = None, port: int | None = None,
                      serve_python: str | None = None, ready_timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
    """Reuse or launch the run's server job for generation and wait until it answers.

    Returns {"job", "reused", "port", "endpoint", "pgid", "vllm_version", "ready_s", "log", "model"}.
    """
    from specops.host.gpus import device_count
    from specops.pipeline.vllm.job import serve_env, start_job

    gpus = device_count()
    python, version = serve_env(serve_python)
    chosen_port = port or run.config.vllm.port
    argv, env = build_generate_command(run, gpus, chosen_port, python, version, speculative)
    signature = generation_signature(run, argv, speculative, version, chosen_port, gpus)
    what = ("the target alone" if not speculative else f"the target with draft {speculative['model']}"
            if speculative.get("model") else f"the target with vLLM's {speculative['method']} speculator")
    job = start_job(run, argv, env, signature, version, ready_timeout_s=ready_timeout_s, same=what, serves=what)
    models = job.ready.get("models") or [str(run.model_path)]
    return {**job.describe(None), "endpoint": f"http://127.0.0.1:{job.port}", "model": models[0], "server": job}


def stop_generating_server(server: dict[str, Any], why: str) -> str:
    return server["server"].stop(why)
