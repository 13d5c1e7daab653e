from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.analysis.sites import site_030, site_0401

__all__ = ["site_030", "site_0401"]


@pytest.fixture(autouse=True, scope="session")
def analysis_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The doctor's analysis cache lives in this session's temp folder, never in the user's home."""
    folder = tmp_path_factory.mktemp("analysis-cache")
    with pytest.MonkeyPatch.context() as session_env:
        session_env.setenv("SPECOPS_ANALYSIS_CACHE", str(folder))
        yield folder
