"""`plan` on an embedded GPU-sized target that is not generated yet (issue 46: `invoke plan --run gpu-kimi` on
`local` wrote a 3.0 GB random model in 68.8 s): it plans from the target's config made in memory, loads no model,
writes nothing large, and says what the run's first step will generate."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.agent import run_agent
from tests.support.repo import REPO

pytestmark = pytest.mark.slow


def test_plan_reads_configs_and_writes_nothing_large(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    shutil.copy(REPO / "runs" / "gpu-kimi.yaml", tmp_path / "runs" / "gpu-kimi.yaml")

    code, document, stderr = run_agent(tmp_path, "plan", "--run", "gpu-kimi", timeout=300)

    assert code in (0, 1), stderr[-2000:]  # 1: the run's mode does not fit this host (a plan all the same)
    written = sum(path.stat().st_size for path in tmp_path.rglob("*") if path.is_file())
    assert written < 10 * 1024 * 1024 and not (tmp_path / "models").exists()
    assert document["target"]["weight_bytes"] > 10**9  # the real shape's size, from its config
    assert "not generated yet" in document["target_note"] and "GB" in document["target_note"]
