"""Site directories unpacked from real wheels, once per test session, shared by analysis and doctor tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.wheels import site_with


def unpacked_site(factory: pytest.TempPathFactory, *packages: tuple[str, str]) -> Path:
    name = "site-" + "-".join(f"{n}{v}" for n, v in packages)
    site = factory.getbasetemp() / name
    done = site / ".unpacked"
    if not done.exists():
        site_with(site, *packages)
        done.touch()
    return site


@pytest.fixture(scope="session")
def site_030(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """speculators 0.3.0 (built for vLLM 0.11) next to vLLM 0.16.0: known breaks."""
    return unpacked_site(tmp_path_factory, ("speculators", "0.3.0"), ("vllm", "0.16.0"))


@pytest.fixture(scope="session")
def site_0401(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """speculators 0.4.0.1 (fixed for vLLM 0.12+) next to vLLM 0.16.0."""
    return unpacked_site(tmp_path_factory, ("speculators", "0.4.0.1"), ("vllm", "0.16.0"))
