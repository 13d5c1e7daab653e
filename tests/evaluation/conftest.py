"""Fixtures of the evaluation tests: the demo run through the whole pipeline (hf backend).

`evaluated` is the root conftest's `finished`: a workdir after `python -m specops pipeline --run tiny`
(regenerated answers, held-out prompts, a trained draft and its hf evaluation), made once per test
run for every worker. Tests copy it before changing anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.finished import copy_of

__all__ = ["copy_of", "evaluated"]


@pytest.fixture(scope="session")
def evaluated(finished: tuple[Path, dict]) -> tuple[Path, dict]:
    """(workdir, the pipeline's summary)."""
    return finished
