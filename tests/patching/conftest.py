"""A throwaway host: real speculators 0.3.0 and vLLM 0.16.0 sources, and the agent as a subprocess."""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent import REPO, run_agent
from tests.support.wheels import fetch_wheel, site_with

SET_NAME = "speculators-0.3.0"
GENERATOR = "speculators/data_generation/vllm_hidden_states_generator.py"
WORKER = "speculators/data_generation/custom_worker.py"


def wheel_member(name: str, version: str, member: str) -> bytes:
    """The bytes a fresh install of the wheel puts at `member`."""
    with zipfile.ZipFile(fetch_wheel(name, version)) as archive:
        return archive.read(member)


def tree_digest(*roots: Path) -> dict[str, str]:
    """sha256 of every file under the roots: proves that nothing was written."""
    digests = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                digests[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


@dataclass
class Host:
    site: Path  # this test's own copy of speculators (mutable)
    vllm_site: Path  # shared, read-only
    workdir: Path

    @property
    def patches(self) -> Path:
        return self.workdir / "patches" / SET_NAME

    def file(self, relative: str) -> Path:
        return self.site / relative

    def agent(self, *args: str) -> tuple[int, dict[str, Any]]:
        # .venv's own site-packages (torch, transformers, speculators 0.9.0) comes after PYTHONPATH,
        # so the test site's speculators 0.3.0 is the one this "host" has installed.
        code, document, _ = run_agent(self.workdir, "patch", *args, sites=(self.site, self.vllm_site))
        return code, document

    def states(self) -> dict[str, str]:
        code, document = self.agent("status", "--set", SET_NAME)
        assert code == 0, document
        return {patch["id"]: patch["state"] for patch in document["sets"][0]["patches"]}


@pytest.fixture(scope="session")
def wheel_sites(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("wheels")
    return site_with(root / "speculators", ("speculators", "0.3.0")), site_with(root / "vllm", ("vllm", "0.16.0"))


@pytest.fixture
def host(tmp_path: Path, wheel_sites: tuple[Path, Path]) -> Host:
    speculators_site, vllm_site = wheel_sites
    site = tmp_path / "site"
    shutil.copytree(speculators_site, site)
    workdir = tmp_path / "work"
    shutil.copytree(REPO / "patches" / SET_NAME, workdir / "patches" / SET_NAME)
    return Host(site, vllm_site, workdir)
