"""`invoke compat`: the speculators × vLLM matrix from released wheels, on the workstation, no GPU host."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import INVOKE, REPO

pytestmark = pytest.mark.wheels

SPECULATORS = "0.3.0,0.4.0.1,0.9.0"
VLLM = "0.16.0,0.33.0"


def invoke_compat(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECOPS_ANALYSIS_CACHE": str(cache)}
    return subprocess.run([str(INVOKE), "compat", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1800)


@pytest.mark.slow  # long: scheduled among the first (tests/support/workers.py)
def test_the_matrix_of_three_speculators_and_two_vllm_releases(tmp_path: Path) -> None:
    result = invoke_compat("--speculators", SPECULATORS, "--vllm", VLLM, "--json", cache=tmp_path / "cache")

    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    cells = {(c["speculators"], c["vllm"]): c for c in document["cells"]}
    assert set(cells) == {(s, v) for s in SPECULATORS.split(",") for v in VLLM.split(",")}
    assert all(c["installed"] == {"speculators": s, "vllm": v} for (s, v), c in cells.items())

    seed = cells[("0.3.0", "0.16.0")]
    assert seed["verdict"] == "errors" and seed["errors"] == 5
    assert seed["first"]["where"] == "speculators/data_generation/vllm_hidden_states_generator.py:136"
    assert "unexpected keyword 'kv_cache_specs'" in seed["first"]["why"]
    [covering] = seed["covered_by"]
    assert covering["name"] == "speculators-0.3.0" and covering["errors_in_patched_files"] == 5

    assert cells[("0.4.0.1", "0.16.0")]["verdict"] == "ok"
    moved = cells[("0.4.0.1", "0.33.0")]
    assert moved["verdict"] == "errors" and moved["covered_by"] == []
    assert any("moved to vllm.v1.core.kv_cache_planning" in e["why"] for e in moved["error_findings"])
    assert cells[("0.9.0", "0.16.0")]["verdict"] == "ok" and cells[("0.9.0", "0.33.0")]["verdict"] == "ok"

    table = invoke_compat("--speculators", SPECULATORS, "--vllm", VLLM, "--markdown", cache=tmp_path / "cache")
    lines = table.stdout.strip().splitlines()
    assert table.returncode == 0 and lines[0] == "| speculators \\ vLLM | 0.16.0 | 0.33.0 |"
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| 0.3.0", "| 0.4.0.1", "| 0.9.0"]
    assert lines[3] == "| 0.4.0.1 | ok | " + lines[3].split(" | ", 2)[2]


def test_a_version_that_is_not_a_release_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = invoke_compat("--vllm", "0.16.x", cache=tmp_path / "cache")

    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["specops: --vllm '0.16.x': not a release version (like 0.16.0)"]
