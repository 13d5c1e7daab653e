"""A serve env whose vLLM was built for another torch or another CUDA is refused before any load (issue 57, item 4):
the wheel's own pin and the CUDA its extension links, read from the files, against the torch beside it. Real
vLLM files (0.33.0's CUDA wheel: its METADATA and its extension), torch's own version.py format."""

from __future__ import annotations

import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from specops.doctor import read_build
from specops.doctor._build import needed_libraries
from testing.agent import REPO, run_agent
from testing.wheels import fetch_wheel, unpack_into

VLLM = ("vllm", "0.33.0")  # pins torch==2.14.0, links libcudart.so.13


def fake_torch(site: Path, version: str, cuda: str | None) -> None:
    info = site / f"torch-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text(
        f"__version__ = '{version}'\ncuda: Optional[str] = {cuda and repr(cuda)}\n")


@pytest.fixture(scope="module")
def vllm_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("vllm-build")
    wheel = fetch_wheel(*VLLM)
    unpack_into(wheel, site)
    with zipfile.ZipFile(wheel) as archive:
        archive.extract("vllm/_C_stable_libtorch.abi3.so", site)
    return site


def env_with(vllm_site: Path, root: Path, torch: str, cuda: str | None) -> list[str]:
    fake_torch(root, torch, cuda)
    return [str(root), str(vllm_site)]


def test_the_extension_links_cuda_13_and_the_wheel_pins_its_torch(vllm_site: Path) -> None:
    assert "libcudart.so.13" in needed_libraries(vllm_site / "vllm" / "_C_stable_libtorch.abi3.so")
    reading = read_build([str(vllm_site)])
    assert (reading.vllm, reading.pinned_torch, reading.vllm_cuda) == ("vllm 0.33.0", "2.14.0", 13)


def test_the_torch_it_was_built_for_passes(vllm_site: Path, tmp_path: Path) -> None:
    assert read_build(env_with(vllm_site, tmp_path, "2.14.0+cu130", "13.0")).refusal() is None


def test_another_torch_is_one_line(vllm_site: Path, tmp_path: Path) -> None:
    line = read_build(env_with(vllm_site, tmp_path, "2.11.0+cu130", "13.0")).refusal()
    assert line == ("the serve env's vllm 0.33.0 was built for torch 2.14.0 (its METADATA pins it), but the env has "
                    "torch 2.11.0+cu130: its extensions will not load; install the vLLM release whose wheel pins "
                    "torch 2.11.0, or torch 2.14.0 in that env")


def test_a_torch_built_for_another_cuda_is_one_line(vllm_site: Path, tmp_path: Path) -> None:
    line = read_build(env_with(vllm_site, tmp_path, "2.14.0+cu128", "12.8")).refusal()
    assert line is not None and "links CUDA 13 (libcudart.so.13), but its torch 2.14.0+cu128 was built for CUDA 12.8" \
        in line


def test_the_run_is_refused_before_any_step(vllm_site: Path, tmp_path: Path) -> None:
    root = tmp_path / "serve"
    path = env_with(vllm_site, root, "2.13.0+cpu", None)
    serve = tmp_path / "serve-python"
    serve.write_text(f"#!/bin/sh\nPYTHONPATH='{':'.join(path)}' exec '{sys.executable}' \"$@\"\n")
    serve.chmod(0o755)
    workdir = tmp_path / "wd"
    shutil.copytree(REPO / "runs", workdir / "runs")
    code, document, _ = run_agent(workdir, "step", "regenerate", "--run", "tiny-vllm",
                                  env={"SPECOPS_SERVE_PYTHON": str(serve)})
    assert code == 2, document
    assert "runs/tiny-vllm.yaml: the serve env's vllm 0.33.0 was built for torch 2.14.0" in document["error"]
    assert not (workdir / "runs" / "tiny-vllm").exists()  # refused at the engine's entry: nothing made


def test_a_server_with_no_room_for_extractions_one_token_is_refused_before_any_load(tmp_path: Path) -> None:
    # measured on an H100: a 1,024-token server and rows of max_seq_len 1,024 failed extraction at its 15,593rd row
    workdir = tmp_path / "wd"
    shutil.copytree(REPO / "runs", workdir / "runs")
    config = workdir / "runs" / "tiny-vllm.yaml"
    config.write_text(config.read_text().replace('["--max-model-len", "512"]', '["--max-model-len=256"]'))
    code, document, _ = run_agent(workdir, "step", "extract", "--run", "tiny-vllm")
    assert code == 2, document
    assert document["error"] == (
        "runs/tiny-vllm.yaml: vllm.serve_args: --max-model-len 256 leaves no room for extraction's one token after a "
        "row of max_seq_len (256) tokens: set --max-model-len 257 or more, or max_seq_len 255")
    assert not (workdir / "runs" / "tiny-vllm").exists()


def test_the_doctor_has_a_row_for_the_build_and_none_for_a_tree_of_python_files(vllm_site: Path,
                                                                              tmp_path: Path) -> None:
    from specops.doctor._build import build_items

    [matched] = build_items(env_with(vllm_site, tmp_path / "a", "2.14.0+cu130", "13.0"))
    assert (matched.check, matched.result) == ("serving", "ok")
    assert matched.why == ("vllm 0.33.0 was built for torch 2.14.0, the env has torch 2.14.0+cu130; it links CUDA 13 "
                           "and its torch was built for CUDA 13.0")
    [refused] = build_items(env_with(vllm_site, tmp_path / "b", "2.13.0+cpu", None))
    assert refused.result == "error"
    assert refused.why.startswith("the serve env's vllm 0.33.0 was built for torch 2.14.0")
    sources_only = tmp_path / "sources"
    unpack_into(fetch_wheel(*VLLM), sources_only)  # what the doctor's tests read releases from: no extension
    assert build_items(env_with(sources_only, tmp_path / "c", "2.13.0+cpu", None)) == []
