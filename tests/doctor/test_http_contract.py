"""speculators >= 0.5 talks to vLLM over HTTP only: the doctor checks the request keys and routes it uses
against the request classes and API routers of the installed vLLM (speculators 0.9.0, vLLM 0.33.0 and 0.16.0
from their wheels). A renamed field is an error naming the speculators line that sends it, before any load."""

from __future__ import annotations

from pathlib import Path

import pytest

from specops.analysis import ModuleIndex
from specops.doctor._http import http_items, sent_by
from tests.support.wheels import site_with

pytestmark = pytest.mark.wheels

SPECULATORS = ("speculators", "0.9.0")


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("http")
    return {version: site_with(root / version, SPECULATORS, ("vllm", version)) for version in ("0.33.0", "0.16.0")}


def _problems(index: ModuleIndex, vllm: str) -> list[tuple[str, str, str]]:
    return [(item.result, item.where, item.why) for item in http_items(index, {"vllm": vllm, "speculators": "0.9.0"})
            if item.result != "ok"]


def test_what_speculators_sends_is_read_from_its_own_files(sites: dict[str, Path]) -> None:
    sent, routes = sent_by(ModuleIndex([str(sites["0.33.0"])]))
    keys = {s.key for s in sent}
    # regenerate's chat request, prepare-data's render request, generate-offline-data's completion request
    assert {"return_token_ids", "continue_final_message", "chat_template_kwargs", "truncate_prompt_tokens",
            "messages", "max_tokens", "model"} <= keys
    assert {"/v1/chat/completions", "/v1/chat/completions/render", "/v1/models"} <= set(routes)
    assert not keys & {"ok", "err", "rps"}  # a progress bar's postfix dict is no request


def test_vllm_0_33_defines_every_key_and_route(sites: dict[str, Path]) -> None:
    assert _problems(ModuleIndex([str(sites["0.33.0"])]), "0.33.0") == []


def test_vllm_0_16_lacks_the_render_requests_truncation_side(sites: dict[str, Path]) -> None:
    [(result, where, why)] = _problems(ModuleIndex([str(sites["0.16.0"])]), "0.16.0")
    assert result == "error" and where.startswith("speculators/data_generation/render_client.py:")
    assert "`truncation_side`" in why


def test_a_renamed_request_field_is_named_where_speculators_sends_it(sites: dict[str, Path]) -> None:
    """The next release renames `return_token_ids` in its request classes (every protocol module that has it)."""
    index = ModuleIndex([str(sites["0.33.0"])])
    for file in (sites["0.33.0"] / "vllm" / "entrypoints").rglob("protocol*.py"):
        index.overlay(file, index.text(file).replace("    return_token_ids:", "    return_tokens:"))
    problems = _problems(index, "0.33.0")
    assert problems and all(result == "error" and "`return_token_ids`" in why for result, _, why in problems)
    assert problems[0][1].startswith(("speculators/cli/regenerate_responses.py:",
                                      "speculators/data_generation/vllm_client.py:"))


def test_a_route_vllm_no_longer_serves_is_an_error(sites: dict[str, Path]) -> None:
    index = ModuleIndex([str(sites["0.33.0"])])
    file = index.module_file("vllm.entrypoints.scale_out.render.api_router")
    index.overlay(file, index.text(file).replace('"/v1/chat/completions/render"', '"/v2/chat/render"'))
    problems = _problems(index, "0.33.0")
    assert [(r, why.split(",")[0]) for r, _, why in problems] == [
        ("error", "speculators calls /v1/chat/completions/render")]
