"""Parallel sizes (specops.planning): vLLM's rules for tensor and data parallelism, defaults from the
host's GPUs and the model's size, and the deterministic row ranges that shard extraction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specops.planning import ModelShape, ParallelSizes, default_sizes, resolve_sizes, row_ranges, size_problems

GIB = 1024**3
H200 = 141 * GIB
LLAMA_8B = ModelShape(heads=32, kv_heads=8, weight_bytes=16 * GIB)
LLAMA_70B = ModelShape(heads=64, kv_heads=8, weight_bytes=140 * GIB)
KIMI_K25 = ModelShape(heads=64, kv_heads=64, experts=384, moe_intermediate=2048, weight_bytes=594 * GIB)
TINY = ModelShape(heads=2, kv_heads=2)


@pytest.mark.parametrize(("shape", "expected"), [
    (LLAMA_8B, ParallelSizes(1, 8)),   # fits one GPU: eight replicas
    (LLAMA_70B, ParallelSizes(2, 4)),  # 70 GB a GPU over 2: four replicas of two
    (KIMI_K25, ParallelSizes(8, 1)),   # the 1T MoE needs all eight for one replica
])
def test_default_sizes_use_the_fewest_gpus_that_hold_the_weights_and_replicate_the_rest(shape, expected) -> None:
    assert default_sizes(8, shape, H200) == expected


def test_without_the_model_size_or_gpu_memory_one_replica_spans_every_gpu_its_heads_allow() -> None:
    assert default_sizes(8, ModelShape(heads=32, kv_heads=8)) == ParallelSizes(8, 1)
    assert default_sizes(8, LLAMA_8B, None) == ParallelSizes(8, 1)
    assert default_sizes(8, TINY) == ParallelSizes(2, 4)  # 2 heads never split over more than 2
    assert default_sizes(0, LLAMA_8B, H200) == ParallelSizes(1, 1)  # a CPU host
    assert default_sizes(1, LLAMA_70B, H200) == ParallelSizes(1, 1)


def test_what_the_run_names_wins_and_a_left_out_size_fills_the_host() -> None:
    assert resolve_sizes(4, None, 8, LLAMA_8B, H200) == ParallelSizes(4, 2)
    assert resolve_sizes(None, 2, 8, LLAMA_8B, H200) == ParallelSizes(4, 2)
    assert resolve_sizes(2, 2, 8, LLAMA_8B, H200) == ParallelSizes(2, 2)
    assert resolve_sizes(None, None, 8, LLAMA_8B, H200) == ParallelSizes(1, 8)


def test_sizes_that_fit_the_host_and_the_model_have_no_problems() -> None:
    assert size_problems(ParallelSizes(8, 1), 8, KIMI_K25) == []
    assert size_problems(ParallelSizes(2, 4), 8, LLAMA_70B) == []
    assert size_problems(ParallelSizes(1, 1), 0, TINY) == []


@pytest.mark.parametrize(("sizes", "gpus", "shape", "result", "why"), [
    (ParallelSizes(4, 4), 8, LLAMA_8B, "error", "tensor 4 x data 4 = 16 GPUs, the host has 8"),
    (ParallelSizes(2, 1), 0, TINY, "error", "tensor 2 x data 1 ranks on a host without GPUs"),
    (ParallelSizes(2, 2), 8, LLAMA_8B, "warn", "tensor 2 x data 2 uses 4 of the host's 8 GPUs"),
    (ParallelSizes(8, 1), 8, TINY, "error", "2 attention heads do not split over tensor parallel 8"),
    (ParallelSizes(6, 1), 6, ModelShape(heads=48, kv_heads=4), "error", "4 KV heads: 6 is not a multiple of them"),
    (ParallelSizes(3, 1), 3, ModelShape(heads=48, kv_heads=8), "error", "8 KV heads: they do not split over 3"),
    (ParallelSizes(8, 1), 8, ModelShape(heads=64, kv_heads=64, experts=384, moe_intermediate=2044), "error",
     "expert intermediate size 2044 does not split over tensor parallel 8"),
])
def test_sizes_vllm_would_refuse_are_named(sizes, gpus, shape, result, why) -> None:
    problems = size_problems(sizes, gpus, shape)
    assert (result, why) in [(found, reason) for found, reason, _fix in problems], problems
    assert all(fix for found, _why, fix in problems if found == "error")


def test_uneven_experts_over_expert_parallel_ranks_is_a_warning() -> None:
    shape = ModelShape(heads=64, kv_heads=64, experts=384, moe_intermediate=2048)
    assert size_problems(ParallelSizes(8, 1), 8, shape, expert_parallel=True) == []
    problems = size_problems(ParallelSizes(1, 5), 5, ModelShape(heads=64, kv_heads=64, experts=384),
                             expert_parallel=True)
    assert [found for found, *_ in problems] == ["warn"]


def test_the_shape_is_read_from_config_json_and_a_wrappers_text_config(tmp_path: Path) -> None:
    config = {"architectures": ["KimiK25ForConditionalGeneration"],
              "text_config": {"num_attention_heads": 64, "num_key_value_heads": 64, "n_routed_experts": 384,
                              "moe_intermediate_size": 2048}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 12345}}))
    shape = ModelShape.from_config(config, tmp_path)
    assert shape == ModelShape(heads=64, kv_heads=64, experts=384, moe_intermediate=2048, weight_bytes=12345)
    # no num_key_value_heads: multi-head attention, as many KV heads as heads
    assert ModelShape.from_config({"num_attention_heads": 12}).kv_heads == 12
    (tmp_path / "model.safetensors.index.json").unlink()
    (tmp_path / "model.safetensors").write_bytes(b"x" * 100)
    assert ModelShape.from_config({}, tmp_path).weight_bytes == 100


@pytest.mark.parametrize(("count", "parts", "expected"), [
    (10, 3, [(0, 4), (4, 7), (7, 10)]),
    (8, 2, [(0, 4), (4, 8)]),
    (2, 4, [(0, 1), (1, 2), (2, 2), (2, 2)]),
    (0, 2, [(0, 0), (0, 0)]),
])
def test_row_ranges_are_contiguous_disjoint_and_cover_every_row(count, parts, expected) -> None:
    ranges = row_ranges(count, parts)
    assert ranges == expected
    assert [row for start, stop in ranges for row in range(start, stop)] == list(range(count))
    assert row_ranges(count, parts) == ranges  # the same cut every time


def test_row_ranges_need_at_least_one_part() -> None:
    with pytest.raises(ValueError, match="parts must be > 0"):
        row_ranges(5, 0)
