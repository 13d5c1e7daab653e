"""build_serve_command and the port-ownership half of the readiness gate: no vLLM needed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.vllm.conftest import free_port, write_run


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from specops.pipeline.data import tiny
    from specops.pipeline.run import Run

    monkeypatch.setenv("SPECOPS_WORKDIR", str(tmp_path))
    (tmp_path / "runs").mkdir()
    tiny.generate(tmp_path)
    write_run(tmp_path, "tiny", "vllm", 8123)
    return Run("tiny", tmp_path)


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_serve_command_carries_the_run_config(run, tmp_path, monkeypatch):
    from specops.pipeline.vllm import build_serve_command

    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    argv, env = build_serve_command(run, 0, 8123, tmp_path, serve_python="/envs/serve/bin/python",
                                    vllm_version="0.32.0+cpu")
    assert argv[:3] == ["/envs/serve/bin/vllm", "serve", str(tmp_path / "models" / "tiny-llama")]
    spec = json.loads(_flag(argv, "--speculative_config"))
    assert spec == {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                    "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}}}
    kv = json.loads(_flag(argv, "--kv_transfer_config"))
    staging = Path(kv["kv_connector_extra_config"]["shared_storage_path"])
    assert kv["kv_connector"] == "ExampleHiddenStatesConnector" and kv["kv_role"] == "kv_producer"
    assert staging.is_dir() and staging.parent == run.paths.run_dir  # same filesystem as hidden_states/
    assert _flag(argv, "--port") == "8123" and _flag(argv, "--host") == "127.0.0.1"
    assert _flag(argv, "--tensor-parallel-size") == "1" and _flag(argv, "--dtype") == "float32"
    assert "--enforce-eager" in argv and "--enable-scale-out" in argv and "--trust-remote-code" not in argv
    assert argv[-2:] == ["--max-model-len", "512"]  # the run's serve_args come last
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # a CPU host's one worker runs inside the engine process
    assert Path(env["VLLM_CACHE_ROOT"]).is_relative_to(tmp_path)
    # TMPDIR is the workdir's, unless zmq's IPC socket names (TMPDIR/<uuid>, at most 107 bytes) would not fit
    assert Path(env["TMPDIR"]).is_relative_to(tmp_path) or Path(env["TMPDIR"]).name.startswith("specops-vllm-")
    assert len(f"ipc://{env['TMPDIR']}/") + 36 < 107


def test_a_vllm_cache_root_and_engine_processes_set_on_the_host_are_kept(run, tmp_path, monkeypatch):
    from specops.pipeline.vllm import build_serve_command

    shared = tmp_path / "host-cache"
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(shared))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    _argv, env = build_serve_command(run, 0, 8123, tmp_path / "workdir", serve_python="/envs/serve/bin/python",
                                     vllm_version="0.32.0+cpu")
    assert env["VLLM_CACHE_ROOT"] == str(shared) and shared.is_dir()
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env  # the host's own choice stands


def test_gpu_host_gets_tensor_parallel_and_no_eager_and_old_vllm_no_scale_out(run, tmp_path):
    from specops.pipeline.vllm import build_serve_command

    run.config.trust_remote_code = True
    argv, env = build_serve_command(run, 8, 8000, tmp_path, serve_python="/p/bin/python", vllm_version="0.25.1")
    # the tiny target has 2 attention heads: vLLM refuses tensor parallel 8 for it (2 % 8), so the 8 GPUs
    # are 4 data-parallel replicas of tensor parallel 2 (the largest size its heads split over)
    assert _flag(argv, "--tensor-parallel-size") == "2" and _flag(argv, "--data-parallel-size") == "4"
    assert _flag(argv, "--dtype") == "bfloat16"
    assert "--enforce-eager" not in argv and "--enable-scale-out" not in argv and "--trust-remote-code" in argv
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env  # a GPU host keeps vLLM's worker processes


def test_the_run_names_its_parallel_sizes_and_a_left_out_one_fills_the_host(run, tmp_path):
    from specops.pipeline.vllm import build_serve_command

    run.config.vllm.tensor_parallel = 1
    argv, _ = build_serve_command(run, 8, 8000, tmp_path, serve_python="/p/bin/python", vllm_version="0.32.0")
    assert _flag(argv, "--tensor-parallel-size") == "1" and _flag(argv, "--data-parallel-size") == "8"
    run.config.vllm.data_parallel = 2
    argv, _ = build_serve_command(run, 8, 8000, tmp_path, serve_python="/p/bin/python", vllm_version="0.32.0")
    assert _flag(argv, "--tensor-parallel-size") == "1" and _flag(argv, "--data-parallel-size") == "2"
    run.config.vllm.tensor_parallel, run.config.vllm.data_parallel = 2, 1
    argv, _ = build_serve_command(run, 8, 8000, tmp_path, serve_python="/p/bin/python", vllm_version="0.32.0")
    assert _flag(argv, "--tensor-parallel-size") == "2" and "--data-parallel-size" not in argv  # 1: vLLM's default


def test_the_generating_server_gets_the_same_parallel_sizes(run, tmp_path):
    from specops.pipeline.vllm.generation import build_generate_command

    argv, _ = build_generate_command(run, 8, 8000, Path("/p/bin/python"), "0.25.1")
    assert _flag(argv, "--tensor-parallel-size") == "2" and _flag(argv, "--data-parallel-size") == "4"
    run.config.vllm.tensor_parallel, run.config.vllm.data_parallel = 1, 8
    argv, _ = build_generate_command(run, 8, 8000, Path("/p/bin/python"), "0.25.1")
    assert _flag(argv, "--tensor-parallel-size") == "1" and _flag(argv, "--data-parallel-size") == "8"


def _own_group(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_listening(port: int) -> None:
    from specops.pipeline.vllm import listening_inodes

    deadline = time.monotonic() + 20
    while not listening_inodes(port):
        assert time.monotonic() < deadline, f"nothing listens on {port}"
        time.sleep(0.1)


def test_port_held_by_another_process_group_is_not_taken_for_ours(tmp_path):
    from specops.pipeline.vllm import port_owner, stop_server, wait_ready

    port = free_port()
    stranger = _own_group([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)])
    ours = _own_group(["sleep", "60"])
    try:
        _wait_listening(port)
        assert port_owner(port, stranger.pid) == {"listening": True, "ours": True, "pids": [stranger.pid]}
        assert port_owner(port, ours.pid)["ours"] is False
        result = wait_ready(port, ours.pid, timeout_s=30, poll_s=0.2, foreign_grace_s=1, progress=lambda _: None)
        assert not result["ok"] and "outside process group" in result["error"]
    finally:
        for process in (stranger, ours):
            stop_server(process.pid, grace_s=5)
            process.wait(timeout=10)


def test_a_dead_group_fails_at_once_with_the_log_tail(tmp_path):
    from specops.pipeline.vllm import start_server, wait_ready

    log = tmp_path / "server.log"
    process = start_server([sys.executable, "-c", "import time; print('loading'); time.sleep(1); "
                            "raise SystemExit('boom: no such model')"], {}, log)
    result = wait_ready(free_port(), process.pid, log=log, timeout_s=60, poll_s=0.2, progress=lambda _: None)
    process.wait(timeout=10)
    assert not result["ok"] and "ended before it was ready" in result["error"]
    assert result["seconds"] < 10 and any("boom: no such model" in line for line in result["log_tail"])


def test_timeout_names_the_group_and_the_last_log_line(tmp_path):
    from specops.pipeline.vllm import start_server, stop_server, wait_ready

    log = tmp_path / "server.log"
    process = start_server([sys.executable, "-u", "-c", "import time; print('Loading weights 3/7'); time.sleep(60)"],
                           {}, log)
    try:
        result = wait_ready(free_port(), process.pid, log=log, timeout_s=2, poll_s=0.2, progress=lambda _: None)
    finally:
        stop_server(process.pid, grace_s=5)
        process.wait(timeout=10)
    assert not result["ok"] and "not ready" in result["error"] and "Loading weights 3/7" in result["error"]
    assert process.returncode == -signal.SIGTERM


def test_a_cpu_host_serves_an_mla_target_with_the_native_rotary(tmp_path, monkeypatch):
    """vLLM's CPU rotary kernel turns MLA's strided query and key views by the wrong positions (every position
    but the first attends wrongly); the CPU server of an MLA target leaves that custom op out, a Llama's and a
    GPU host's keep vLLM's defaults, and a run that sets its own compilation config keeps it."""
    from specops.pipeline.run import Run
    from specops.pipeline.vllm import build_serve_command
    from specops.pipeline.vllm.generation import build_generate_command
    from tests.support.mla import mla_workdir

    monkeypatch.setenv("SPECOPS_WORKDIR", str(tmp_path))
    run = Run("mla", mla_workdir(tmp_path, vllm={"serve_args": []}))
    served, _ = build_serve_command(run, 0, 8123, tmp_path, serve_python="/p/bin/python", vllm_version="0.32.0+cpu")
    generating, _ = build_generate_command(run, 0, 8124, Path("/p/bin/python"), "0.32.0+cpu")
    for argv in (served, generating):
        assert "--enforce-eager" in argv
        assert json.loads(_flag(argv, "--compilation-config")) == {"custom_ops": ["all", "-rotary_embedding"]}

    on_gpus, _ = build_serve_command(run, 8, 8123, tmp_path, serve_python="/p/bin/python", vllm_version="0.32.0")
    assert "--compilation-config" not in on_gpus

    run.config.vllm.serve_args = ["-O0"]
    own, _ = build_serve_command(run, 0, 8123, tmp_path, serve_python="/p/bin/python", vllm_version="0.32.0+cpu")
    assert "--compilation-config" not in own and own[-1] == "-O0"


def test_a_cpu_host_serves_a_llama_with_vllms_default_ops(run, tmp_path):
    from specops.pipeline.vllm import build_serve_command

    argv, _ = build_serve_command(run, 0, 8123, tmp_path, serve_python="/p/bin/python", vllm_version="0.32.0+cpu")
    assert "--enforce-eager" in argv and "--compilation-config" not in argv
