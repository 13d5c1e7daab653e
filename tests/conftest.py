"""Shared fixtures: a real sshd on loopback, an inventory with a local and an SSH host, the CLI."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from specops import collector
from tests.support.cli import Cli, write_inventory
from tests.support.finished import finished_pipeline
from tests.support.finished_kimi import finished_kimi_pipeline
from tests.support.sshd import SshServer, start_sshd

# One definition of each serve-env fixture for the whole tree: a fixture imported into several conftests
# is several session fixtures (the patch set applied, a server started, once per conftest).
from tests.support.vllm import patched_vllm, shared_vllm  # noqa: F401

collector.for_imports()  # the workers import torch, transformers and speculators too: as the agent does

pytest_plugins = ["tests.support.workers"]  # modules sharing a module fixture stay in one worker

PYTHON = sys.executable  # the host env of the test hosts is this checkout's .venv


@pytest.fixture(scope="session", autouse=True)
def vllm_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One vLLM cache for the servers this worker starts (VLLM_CACHE_ROOT, inherited by the agents and
    their jobs; a host's own VLLM_CACHE_ROOT is kept by the serve command): its model-info cache
    spares every later server load the architecture-inspecting subprocess."""
    folder = tmp_path_factory.mktemp("vllm-cache")
    with pytest.MonkeyPatch.context() as session_env:
        session_env.setenv("VLLM_CACHE_ROOT", str(folder))
        yield folder


@pytest.fixture(scope="session")
def finished(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """(workdir, summary) of the demo run after a whole pipeline, built once per test run for every
    worker (tests/support/finished.py); copy it (`copy_of`) before changing anything."""
    return finished_pipeline(request.config, tmp_path_factory)


@pytest.fixture(scope="session")
def finished_kimi(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """(workdir, summary) of the Kimi-K2.5-shaped run (the wrapper, hf backend, at test size) after a whole
    pipeline, built once per test run for every worker (tests/support/finished_kimi.py); copy it first."""
    return finished_kimi_pipeline(request.config, tmp_path_factory)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory, vllm_cache: Path) -> Iterator[SshServer]:
    # the host's profile sets the worker's vLLM cache, as a GPU host's often sets one for every workdir
    server = start_sshd(tmp_path_factory.mktemp("sshd"), environment={"VLLM_CACHE_ROOT": str(vllm_cache)})
    yield server
    server.stop()


def ssh_host(sshd: SshServer, workdir: Path, known_hosts: Path, **extra: object) -> dict:
    return {"address": "127.0.0.1", "port": sshd.port, "user": sshd.user, "identity_file": str(sshd.client_key),
            "known_hosts": str(known_hosts), "workdir": str(workdir), "python": PYTHON, "connect_timeout": 5,
            **extra}


@pytest.fixture
def known_hosts(tmp_path: Path, sshd: SshServer) -> Path:
    path = tmp_path / "known_hosts"
    path.write_text(sshd.known_hosts_line())
    return path


@pytest.fixture
def inventory(tmp_path: Path, sshd: SshServer, known_hosts: Path) -> Path:
    """An inventory with `local` (no SSH) and `loop` (the real sshd), each with its own workdir."""
    hosts = {
        "local": {"connection": "local", "workdir": str(tmp_path / "local-workdir"), "python": PYTHON},
        "loop": ssh_host(sshd, tmp_path / "loop-workdir", known_hosts),
    }
    return write_inventory(tmp_path / "inventory.yaml", hosts, default="local")


@pytest.fixture
def cli(inventory: Path, tmp_path: Path) -> Cli:
    return Cli(inventory, tmp_path / "logs")


@pytest.fixture
def control_dir() -> Iterator[Path]:
    """A private folder for the shared OpenSSH masters of one test (SPECOPS_SSH_CONTROL_DIR); the
    masters the test opened are ended after it."""
    # Short on purpose: a socket path must fit in sun_path (tmp_path is often too deep).
    folder = Path(tempfile.mkdtemp(prefix="sp-mux-"))
    yield folder
    for socket_path in folder.iterdir():
        subprocess.run(["ssh", "-o", f"ControlPath={socket_path}", "-O", "exit", "unused"], capture_output=True,
                       timeout=10)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=["local", "loop"])
def host_name(request: pytest.FixtureRequest) -> str:
    """Runs a test once on the local host and once over the real sshd."""
    return request.param
