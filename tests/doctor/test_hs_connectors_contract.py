"""hs_connectors, speculators ≥ 0.8's hidden-states transport, is a second caller into vLLM: its imports are judged
against the installed vLLM like speculators' own (doctor/_contract.py CALLERS). Real wheels (tests/support/wheels.py,
the same cache `invoke compat` fills)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specops.analysis import ModuleIndex
from specops.doctor._contract import CALLER, check_api_contract, check_connector_contract
from tests.support.wheels import site_with

pytestmark = pytest.mark.wheels

HS = ("hs-connectors", "0.9.0")
SPECULATORS = ("speculators", "0.9.0")
# what hs-connectors 0.9.0 imports that vLLM 0.16.0 lacks (the hidden-states connector came in 0.17)
MISSING_ON_016 = {
    "hs_connectors/fp8_hidden_states_connector.py:23",
    "hs_connectors/mooncake_hidden_states_connector.py:25",
    "hs_connectors/mooncake_hidden_states_connector.py:88",
    "hs_connectors/mooncake_hidden_states_connector.py:231",
}


@pytest.fixture(scope="module")
def site_016(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return site_with(tmp_path_factory.mktemp("hs-016"), SPECULATORS, HS, ("vllm", "0.16.0"))


@pytest.fixture(scope="module")
def site_033(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return site_with(tmp_path_factory.mktemp("hs-033"), SPECULATORS, HS, ("vllm", "0.33.0"))


def hs_items(search_path: list[Path], vllm: str) -> list[dict]:
    items = check_api_contract(ModuleIndex([str(p) for p in search_path]), {"vllm": vllm, "speculators": "0.9.0"})
    return [item.to_dict() for item in items if "hs_connectors" in item.where]


def _relative(where: str) -> str:
    return "hs_connectors/" + where.split("/hs_connectors/", 1)[1]


def test_on_vllm_016_the_names_it_lacks_are_errors_at_their_lines(site_016: Path) -> None:
    items = hs_items([site_016], "0.16.0")

    errors = [i for i in items if i["result"] == "error"]
    assert MISSING_ON_016 <= {_relative(i["where"]) for i in errors}
    assert any("HiddenStateCacheSpec" in i["why"] for i in errors)
    assert all("hs-connectors 0.9.0" in i["fix"] for i in errors)
    # each connector module is loaded by vLLM only for its own backend: the finding says which
    [fp8] = [i for i in errors if i["where"].endswith("fp8_hidden_states_connector.py:23")]
    assert "vLLM loads this module only for FP8Backend's KV connector (" in fp8["why"]
    assert "hs_connectors/transfer.py:" in fp8["why"]
    [summary] = [i for i in items if i["where"] == "hs_connectors"]
    assert summary["result"] == "ok"


def test_on_vllm_033_every_import_binds(site_033: Path) -> None:
    items = hs_items([site_033], "0.33.0")

    assert [i for i in items if i["result"] == "error"] == []
    [summary] = [i for i in items if i["where"] == "hs_connectors"]
    bound = int(summary["why"].split()[0])
    assert bound >= 18  # the ~18 vLLM names it imports, and its calls


def test_without_hs_connectors_nothing_is_said_about_it(tmp_path: Path) -> None:
    site = site_with(tmp_path / "site", SPECULATORS)

    assert hs_items([site], "0.33.0") == []


def test_an_import_renamed_to_a_name_vllm_lacks_is_named_at_its_line(site_033: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(site_033 / "hs_connectors", broken / "hs_connectors")
    file = broken / "hs_connectors" / "mooncake_hidden_states_connector.py"
    source = file.read_text()
    assert "    SupportsHMA,\n" in source
    file.write_text(source.replace("    SupportsHMA,\n", "    SupportsHybridMemory,\n", 1))
    line = source.splitlines().index("    SupportsHMA,") + 1

    items = hs_items([broken, site_033], "0.33.0")  # the broken copy first: it is the hs_connectors judged

    errors = [i for i in items if i["result"] == "error"]
    assert len(errors) == 1
    [error] = errors
    assert error["where"] == f"{file}:{line - 4}"  # the `from vllm...base import (` statement's first line
    assert "SupportsHybridMemory" in error["why"]
    assert "vllm/distributed/kv_transfer/kv_connector/v1/base.py" in error["why"]


def test_judged_in_the_serve_env_when_the_run_env_is_another(site_016: Path, tmp_path: Path) -> None:
    run_env = site_with(tmp_path / "run", SPECULATORS)  # speculators alone: the run's env has no vLLM
    run_items = check_api_contract(ModuleIndex([str(run_env)]), {"vllm": None}, callers=(CALLER,))
    serve_items = check_connector_contract(ModuleIndex([str(site_016)]), {"vllm": "0.16.0"})

    assert [i for i in run_items if "hs_connectors" in i.where] == []
    assert MISSING_ON_016 <= {_relative(i.where) for i in serve_items if i.result == "error"}
    assert check_connector_contract(ModuleIndex([str(run_env)]), {"vllm": None}) == []
