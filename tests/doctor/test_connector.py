"""The doctor's check of the run's hidden-states backend against the serve env: the connector hs_connectors'
backend names (read from its transfer.py) must be importable where vLLM runs, with what it imports from vLLM."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from specops.analysis import ModuleIndex
from specops.doctor._connector import backend_connector, connector_items
from tests.support.vllm import VLLM_PYTHON, needs_vllm

SERVE_SITE = next((VLLM_PYTHON.parent.parent / "lib").glob("python3*/site-packages"), None) if VLLM_PYTHON.exists() \
    else None


@pytest.fixture(scope="module")
def serving() -> ModuleIndex:
    return ModuleIndex([str(SERVE_SITE)])


@needs_vllm
def test_the_connector_is_read_from_hs_connectors(serving) -> None:
    assert backend_connector(serving, "fp8") == ("FP8HiddenStatesConnector",
                                                  "hs_connectors.fp8_hidden_states_connector")
    assert backend_connector(serving, "file") == ("ExampleHiddenStatesConnector", None)


@needs_vllm
def test_fp8_in_the_serve_env_is_ok_and_mooncake_lacks_its_store(serving) -> None:
    (fp8,) = connector_items(serving, "fp8", "0.32.0")
    assert fp8.result == "ok", fp8
    results = {item.where: item.result for item in connector_items(serving, "mooncake", "0.32.0")}
    assert results["mooncake.store"] == "error"


def test_an_env_without_the_vllm_it_subclasses_is_an_error() -> None:
    """The run's own env (.venv: hs_connectors but no vLLM) as a serve env: the fp8 connector would not load."""
    index = ModuleIndex([sysconfig.get_paths()["purelib"]])
    (item,) = connector_items(index, "fp8", "0.32.0")
    assert item.result == "error" and "imports vllm.distributed" in item.why


def test_a_serve_env_without_hs_connectors_is_an_error(tmp_path: Path) -> None:
    (item,) = connector_items(ModuleIndex([str(tmp_path)]), "fp8", "0.32.0")
    assert item.result == "error" and "hs-connectors" in item.fix
    assert connector_items(ModuleIndex([str(tmp_path)]), "file", "0.32.0") == []
