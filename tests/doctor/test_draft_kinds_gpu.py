"""On a GPU host the doctor judges a run's kind of draft by vLLM's CUDA build, not by what the CPU build refuses
(issue 57): real vLLM sources, from its CUDA wheel."""

from __future__ import annotations

import sys

import pytest

from specops.doctor import draft_kind, is_cpu_build
from testing.wheels import site_with


def test_on_a_gpu_host_vllms_cuda_build_serves_the_kinds_its_cpu_build_refuses(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # vLLM's CUDA build (0.33.0's wheel, its Python files): a GPU worker runs Model Runner V2 for dspark and for a
    # dense target (VllmConfig.use_v2_model_runner), so what the CPU build's V1 runner refuses is no refusal here
    cuda_build = [str(site_with(tmp_path_factory.mktemp("vllm-033"), ("vllm", "0.33.0")))]
    assert is_cpu_build(cuda_build) is False
    for kind in ("dspark", "dflash2", "eagle3"):
        reading = draft_kind(kind, sys.path, cuda_build, tokens=3, cpu_host=False)
        assert reading.serves is True and reading.refusal() is None and reading.runner_refuses is None, kind
