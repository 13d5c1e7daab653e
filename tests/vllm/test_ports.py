"""A port held by anything is found before a run starts, and named in one line (exit 2, nothing written).

The session's shared server (another workdir's run `tiny`) holds its port; a second workdir whose run
serves on that same port with other serve args (a server that does not fit it; one that fits is used as
it is, test_reuse.py) is refused by `run check` (what every task asks before it launches) and by
`pipeline` itself before its first step: the line names the holder (its job and run), what does not fit,
how to free it and which setting moves the port. A foreign process (a plain listening socket) is named by
its pid.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.agent import run_agent
from tests.support.runs import edit_run
from tests.support.vllm import ServerJob, tiny_workdir
from tests.vllm.conftest import VLLM_PYTHON, free_port, in_vllm_worker, needs_vllm

pytestmark = [pytest.mark.vllm, needs_vllm, in_vllm_worker]

ENV = {"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON)}


def _written(workdir: Path) -> list[str]:
    """What a run's steps or jobs would have left: job records, logs, the run's outputs."""
    found = [str(path.relative_to(workdir)) for path in (workdir / "state" / "jobs").glob("*.json")]
    found += [str(path.relative_to(workdir)) for path in (workdir / "logs").glob("*.log")] \
        if (workdir / "logs").is_dir() else []
    run_dir = workdir / "runs" / "tiny"
    found += [str(path.relative_to(workdir)) for path in run_dir.iterdir()] if run_dir.is_dir() else []
    return found


@pytest.fixture(scope="module")
def second(tmp_path_factory, shared_vllm) -> tuple[Path, ServerJob]:
    """Another workdir whose run tiny serves on the port the session's server holds, with other serve args: the
    server does not fit it (one that fits is used as it is: test_reuse.py)."""
    server = shared_vllm.server()
    workdir = tiny_workdir(tmp_path_factory.mktemp("second"), server.port)
    edit_run(workdir / "runs" / "tiny.yaml", vllm={"serve_args": ["--max-model-len", "384"]})
    return workdir, server


def test_run_check_names_the_other_runs_server_holding_the_port(second) -> None:
    workdir, server = second
    code, document, _ = run_agent(workdir, "run", "check", "--run", "tiny", env=ENV)
    assert code == 2, document
    line = document["error"]
    assert "\n" not in line
    assert line.startswith("runs/tiny.yaml: vllm.port: ")
    assert f"port {server.port} is held by vLLM server job {server.job['id']} of run 'tiny'" in line
    assert "which does not fit this run (its serve_args differ)" in line
    assert f"invoke stop --job {server.job['id']}" in line
    assert "set vllm.port in runs/tiny.yaml to a free port" in line


def test_the_pipeline_refuses_before_its_first_step_and_writes_nothing(second) -> None:
    workdir, server = second
    before = _written(workdir)
    code, document, stderr = run_agent(workdir, "pipeline", "--run", "tiny", env=ENV)
    assert code == 2, document
    assert f"vLLM server job {server.job['id']}" in document["error"]
    assert "== patches" not in stderr  # not one step began
    assert _written(workdir) == before


def test_a_foreign_process_on_the_port_is_named_by_its_pid(tmp_path) -> None:
    import os

    port = free_port()
    workdir = tiny_workdir(tmp_path / "w", port)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        code, document, _ = run_agent(workdir, "run", "check", "--run", "tiny", env=ENV)
    assert code == 2, document
    assert f"port {port} is held by pid {os.getpid()} (" in document["error"]
    assert f"not a specops job; end it (kill {os.getpid()}) or set vllm.port in runs/tiny.yaml" in document["error"]


def test_a_free_port_passes(tmp_path) -> None:
    workdir = tiny_workdir(tmp_path / "w", free_port())
    code, document, _ = run_agent(workdir, "run", "check", "--run", "tiny", env=ENV)
    assert code == 0, document
