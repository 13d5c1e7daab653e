"""Fixtures of the vLLM backend tests: the patched serve env, the session's shared vLLM CPU server
(tests/support/vllm.py), a tiny workdir per module, and what a test needs to start a server of its own.

Tests that need the serve env are marked `vllm` and `in_vllm_worker` (one xdist worker for all of
them) and skipped, with the reason, where .venv-vllm is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.agent import REPO
from tests.support.agent import run_agent as agent
from tests.support.vllm import (
    PATCH_SET,
    READY_TIMEOUT_S,
    VLLM_PYTHON,
    ServerJob,
    SharedVllm,
    free_port,
    in_vllm_worker,
    needs_vllm,
    tiny_workdir,
    write_run,
)

__all__ = ["PATCH_SET", "READY_TIMEOUT_S", "REPO", "VLLM_PYTHON", "ServerJob", "SharedVllm", "agent", "free_port",
           "in_vllm_worker", "needs_vllm", "serve_argv", "write_run"]


@pytest.fixture(scope="module")
def vllm_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workdir of this module's own with the tiny model and data: runs tiny (vllm backend), tinyhf (hf)."""
    return tiny_workdir(tmp_path_factory.mktemp("vllm-workdir"), free_port())


@pytest.fixture
def vllm_server(shared_vllm: SharedVllm) -> ServerJob:
    """The session's running server job (started again if a test stopped it)."""
    return shared_vllm.server()


def serve_argv(workdir: Path) -> tuple[list[str], dict[str, str], int]:
    os.environ["SPECOPS_WORKDIR"] = str(workdir)
    from specops.pipeline.run import Run
    from specops.pipeline.vllm import build_serve_command

    run = Run("tiny", workdir)
    port = run.config.vllm.port
    argv, env = build_serve_command(run, 0, port, workdir, serve_python=VLLM_PYTHON)
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB; the default takes a large share of a shared machine
    return argv, env, port
