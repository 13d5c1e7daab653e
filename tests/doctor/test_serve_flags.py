"""The doctor finds `vllm serve`'s flags where the installed release defines them, followed from its own console
script (entry_points.txt -> cli/main.py -> the `serve` subcommand -> make_arg_parser -> FrontendArgs and
AsyncEngineArgs), not from a list of module names: vLLM 0.33 moved the server's own flags (--host, --port,
--enable-scale-out) from entrypoints/launchers/cli_args.py to entrypoints/common/cli_args.py, and the list
called them "not defined" (error), refusing every vllm launch. A flag proven absent is an error; one whose
definer could not be followed is "unknown". Real vLLM 0.33.0 sources (its wheel), changed in memory only."""

from __future__ import annotations

from pathlib import Path

import pytest

from specops.analysis import ModuleIndex
from specops.doctor._flags import check_flags
from tests.support.wheels import site_with

pytestmark = pytest.mark.wheels

FLAGS = ["--host", "--port", "--enable-scale-out", "--speculative-config", "--kv-transfer-config",
         "--compilation-config", "--max-model-len", "--dtype", "--no-enable-prefix-caching"]
VERSIONS = {"vllm": "0.33.0"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return site_with(tmp_path_factory.mktemp("vllm-0.33.0"), ("vllm", "0.33.0"))


def _results(index: ModuleIndex) -> dict[str, tuple[str, str]]:
    return {item.where.removeprefix("vllm serve "): (item.result, item.why)
            for item in check_flags(index, {"serve_flags": FLAGS}, VERSIONS)}


def _overlay(index: ModuleIndex, module: str, change) -> None:
    file = index.module_file(module)
    index.overlay(file, change(index.text(file)))


def test_vllm_0_33s_serve_flags_are_found_where_it_moved_them(site: Path) -> None:
    index = ModuleIndex([str(site)])
    results = _results(index)
    assert {flag: result for flag, (result, _) in results.items()} == dict.fromkeys(FLAGS, "ok")
    for flag in ("--host", "--port", "--enable-scale-out"):
        assert results[flag][1].startswith("defined at cli_args.py:"), results[flag]
    assert index.files_parsed < 40  # the files the entry point leads to, not vLLM's 1,300


def test_a_flag_the_release_dropped_is_an_error_naming_what_was_followed(site: Path) -> None:
    index = ModuleIndex([str(site)])
    _overlay(index, "vllm.entrypoints.common.cli_args", lambda text: text.replace("    port: int = 8000\n", ""))
    result, why = _results(index)["--port"]
    assert result == "error"
    assert "followed from the console script vllm = vllm.entrypoints.cli.main:main" in why
    assert "vllm/entrypoints/common/cli_args.py" in why


def test_a_parser_moved_again_is_followed_there(site: Path) -> None:
    """The next release moves make_arg_parser into arg_utils.py: the serve subcommand's import leads there."""
    index = ModuleIndex([str(site)])
    common = index.text(index.module_file("vllm.entrypoints.common.cli_args"))
    start = common.index("def make_arg_parser(")
    moved = common[start:common.index("\ndef ", start + 1)]
    _overlay(index, "vllm.engine.arg_utils", lambda text: text + "\n\nfrom vllm.entrypoints.common.cli_args "
             "import FrontendArgs  # noqa\n\n\n" + moved)
    _overlay(index, "vllm.entrypoints.cli.serve", lambda text: text.replace(
        "from vllm.entrypoints.common.cli_args import (", "from vllm.engine.arg_utils import make_arg_parser\n"
        "from vllm.entrypoints.common.cli_args import (").replace("    make_arg_parser,\n", ""))
    results = _results(index)
    assert {flag: result for flag, (result, _) in results.items()} == dict.fromkeys(FLAGS, "ok"), results


def test_a_parser_that_cannot_be_followed_is_unknown_not_an_error(site: Path) -> None:
    index = ModuleIndex([str(site)])
    _overlay(index, "vllm.entrypoints.common.cli_args", lambda text: text.replace(
        "    parser = FrontendArgs.add_cli_args(parser)\n", "    parser = plugin_args().add_cli_args(parser)\n"
    ).replace("    port: int = 8000\n", ""))
    result, why = _results(index)["--port"]
    assert result == "unknown", why
