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
    # speculators 0.9.0 makes no Python call into vLLM, but its server needs extract_hidden_states and the
    # hidden-states connector (vLLM ≥ 0.17), and hs-connectors 0.9.0 imports names 0.16 lacks
    server = cells[("0.9.0", "0.16.0")]
    assert server["verdict"] == "errors"
    missing = [e for e in server["error_findings"] if e["check"] == "capability"]
    assert {e["why"].split(";")[0] for e in missing} == {"vLLM 0.16.0 lacks extract_hidden_states",
                                                         "vLLM 0.16.0 lacks ExampleHiddenStatesConnector"}
    assert all(e["fix"] == "install vLLM ≥0.17" for e in missing)
    assert "hs_connectors/transfer.py:199 names it" in missing[1]["why"]
    assert "hs_connectors/mooncake_hidden_states_connector.py:88" in {e["where"] for e in server["error_findings"]}
    assert cells[("0.9.0", "0.33.0")]["verdict"] == "ok"
    # the transformers axis: each cell judged under the newest transformers its pins allow, not the workstation's
    assert {c["transformers"] for (s, _v), c in cells.items() if s == "0.9.0"} == {"5.19.0"}
    assert cells[("0.4.0.1", "0.16.0")]["transformers"] == "4.57.6"
    assert any("pip cannot install them in one env" in pin for pin in moved["pins"])

    table = invoke_compat("--speculators", SPECULATORS, "--vllm", VLLM, "--markdown", cache=tmp_path / "cache")
    lines = table.stdout.strip().splitlines()
    head = lines.index("| speculators \\ vLLM | 0.16.0 | 0.33.0 |")
    assert table.returncode == 0 and lines[0].startswith("# ")
    assert [line.split(" | ")[0] for line in lines[head + 2:head + 5]] == ["| 0.3.0", "| 0.4.0.1", "| 0.9.0"]
    assert lines[head + 3].startswith("| 0.4.0.1 | ok · tf 4.57.6 | **7 error(s)**")
    nine = lines[head + 4].split(" | ")
    assert nine[1].startswith("**") and "install vLLM ≥0.17" in nine[1] and nine[2] == "ok · tf 5.19.0 |"
    assert "- error (capability) `vllm/config/speculative.py`: vLLM 0.16.0 lacks extract_hidden_states" in table.stdout


def test_a_transformers_axis_judges_each_pair_under_each_release(tmp_path: Path) -> None:
    result = invoke_compat("--speculators", "0.9.0", "--vllm", "0.33.0", "--transformers", "5.19.0,4.57.6", "--json",
                           cache=tmp_path / "cache")

    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["transformers"] == ["5.19.0", "4.57.6"]
    cells = {c["transformers"]: c for c in document["cells"]}
    assert cells["5.19.0"]["verdict"] == "ok" and cells["5.19.0"]["pins"] == []
    assert cells["4.57.6"]["pins"] == ["speculators 0.9.0 requires transformers<=5.19.0,>=5.0.0: 4.57.6 is outside it"]


def test_a_version_that_is_not_a_release_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = invoke_compat("--vllm", "0.16.x", cache=tmp_path / "cache")

    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["specops: --vllm '0.16.x': not a release version (like 0.16.0)"]
    bad = invoke_compat("--transformers", "five", cache=tmp_path / "cache")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == ["specops: --transformers 'five': not a release version (like 0.16.0)"]
