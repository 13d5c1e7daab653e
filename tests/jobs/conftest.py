"""Fixtures for the host side of jobs: a private workdir, hence a private tmux server, per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agent import Agent


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    workdir = tmp_path / "a workdir with spaces" / ("deep" * 20)  # too long for a -S socket path
    workdir.mkdir(parents=True)
    host_agent = Agent(workdir)
    yield host_agent
    host_agent.clean_up()
