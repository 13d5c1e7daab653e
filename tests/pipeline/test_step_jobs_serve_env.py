"""Every job of a run gets the host's serve env (inventory envs.serve), not a chosen few: a step runs the steps
it reads (`invoke prepare` runs regenerate first, which may start the run's vLLM server), and each step judges
vLLM where the run's server runs. Before, `invoke prepare`, `validate` and `vocab` ran without it: their
settings read the default env's vLLM (none here), and a regenerate through vLLM inside prepare started its
server from an env without vLLM."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.support.agent import REPO
from tests.support.cli import Cli, write_inventory
from tests.support.vllm import VLLM_PYTHON, needs_vllm


@needs_vllm
@pytest.mark.slow  # the real `invoke prepare`: the agent synced to a local host, the tiny target made, 4 rows
def test_a_step_job_runs_with_the_hosts_serve_env(tmp_path: Path) -> None:
    from specops.doctor import vllm_version
    from specops.doctor._serve_env import interpreter_path

    runs = tmp_path / "runs"
    shutil.copytree(REPO / "runs", runs)
    inventory = write_inventory(tmp_path / "inventory.yaml", {"local": {
        "connection": "local", "workdir": str(tmp_path / "workdir"), "python": sys.executable,
        "envs": {"serve": str(VLLM_PYTHON)}}}, default="local")
    done = Cli(inventory, tmp_path / "logs")("prepare", "--run", "tiny", "--samples", "4", "--json", timeout=600,
                                             SPECOPS_RUNS_DIR=str(runs))
    assert done.exit_code == 0, done.stderr[-3000:]
    settings = done.json()["settings"]
    assert settings["serve_python"] == str(VLLM_PYTHON)
    # the serve env's vLLM, read where it is installed (the default env has none to read)
    assert settings["vllm"] == vllm_version(interpreter_path(str(VLLM_PYTHON)))
    assert settings["vllm"] is not None
