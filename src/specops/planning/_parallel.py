"""Parallel sizes of a run: vLLM's tensor and data parallelism on one host, torchrun's ranks, row shards.

Pure functions over plain values (a model's config.json as a dict, GPU counts and memory), standard
library only: the pipeline builds its command lines from them and the doctor checks a run with the
same rules, so the two never disagree. The rules are vLLM's own (0.32): the attention heads split
evenly over the tensor-parallel ranks (config/model.py verify_with_parallel_config); KV heads either
split evenly or are replicated a whole number of times (linear.py QKVParallelLinear); an MoE's
expert weights split along their intermediate size without expert parallelism.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What one GPU may hold of the weights when the default tensor-parallel size is chosen: the rest is
# KV cache, activations and the extraction connector's buffers (vLLM's gpu_memory_utilization is 0.9).
WEIGHT_SHARE = 0.6
EXPERT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")


@dataclass(frozen=True)
class ModelShape:
    """What parallelism depends on, read from a model's config.json (a wrapper's text_config)."""

    heads: int | None = None
    kv_heads: int | None = None
    experts: int | None = None
    moe_intermediate: int | None = None
    weight_bytes: int | None = None  # safetensors index total_size, else the sum of the shard sizes

    @classmethod
    def from_config(cls, config: dict[str, Any], model_dir: Path | None = None) -> ModelShape:
        inner = config.get("text_config")
        text = {**config, **inner} if isinstance(inner, dict) else config

        def count(*keys: str) -> int | None:
            for key in keys:
                value = text.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
            return None

        heads = count("num_attention_heads")
        return cls(heads=heads, kv_heads=count("num_key_value_heads") or heads, experts=count(*EXPERT_KEYS),
                   moe_intermediate=count("moe_intermediate_size"),
                   weight_bytes=weight_bytes(model_dir) if model_dir is not None else None)


def weight_bytes(model_dir: Path) -> int | None:
    """The weights' size: the safetensors index's total_size, else the shards' file sizes; None if neither."""
    index = model_dir / "model.safetensors.index.json"
    try:
        total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        if isinstance(total, int) and total > 0:
            return total
    except (OSError, ValueError, AttributeError):
        pass
    shards = sorted(model_dir.glob("*.safetensors")) if model_dir.is_dir() else []
    return sum(shard.stat().st_size for shard in shards) or None


@dataclass(frozen=True)
class ParallelSizes:
    tensor: int = 1
    data: int = 1

    @property
    def gpus(self) -> int:
        return self.tensor * self.data


def tp_fits_heads(tp: int, shape: ModelShape) -> bool:
    if shape.heads is not None and shape.heads % tp:
        return False
    kv = shape.kv_heads
    return kv is None or (tp % kv == 0 if tp >= kv else kv % tp == 0)


def default_sizes(gpus: int, shape: ModelShape, gpu_memory_bytes: int | None = None) -> ParallelSizes:
    """vLLM's sizes when the run names none: the fewest GPUs per replica that hold the weights, the
    rest as data-parallel replicas (extraction is throughput work: replicas scale it best).

    Without the model's size or the GPUs' memory, one replica over every GPU (what fits any model that
    fits the host). A CPU host (0 GPUs) is 1 x 1."""
    if gpus <= 1:
        return ParallelSizes()
    candidates = [tp for tp in range(1, gpus + 1) if gpus % tp == 0 and tp_fits_heads(tp, shape)]
    if not candidates:
        return ParallelSizes()
    if shape.weight_bytes is None or not gpu_memory_bytes:
        return ParallelSizes(candidates[-1], gpus // candidates[-1])
    for tp in candidates:
        if shape.weight_bytes / tp <= WEIGHT_SHARE * gpu_memory_bytes:
            return ParallelSizes(tp, gpus // tp)
    return ParallelSizes(candidates[-1], gpus // candidates[-1])


def resolve_sizes(tensor: int | None, data: int | None, gpus: int, shape: ModelShape,
                  gpu_memory_bytes: int | None = None) -> ParallelSizes:
    """The run's sizes: what it names wins; a size it leaves out fills the host's GPUs."""
    if tensor is None and data is None:
        return default_sizes(gpus, shape, gpu_memory_bytes)
    if tensor is None:
        tensor = max(gpus // data, 1) if data else 1
    if data is None:
        data = max(gpus // tensor, 1)
    return ParallelSizes(tensor, data)


def size_problems(sizes: ParallelSizes, gpus: int, shape: ModelShape, *,
                  expert_parallel: bool = False) -> list[tuple[str, str, str]]:
    """(result, why, how to fix) for each way the sizes cannot run on this host and model; [] when they can."""
    found: list[tuple[str, str, str]] = []
    tp, dp = sizes.tensor, sizes.data
    if gpus == 0 and sizes.gpus > 1:
        found.append(("error", f"tensor {tp} x data {dp} ranks on a host without GPUs",
                      "set vllm.tensor_parallel and vllm.data_parallel to 1 on a CPU host"))
    elif gpus and sizes.gpus > gpus:
        found.append(("error", f"tensor {tp} x data {dp} = {sizes.gpus} GPUs, the host has {gpus}",
                      f"make tensor_parallel x data_parallel <= {gpus}"))
    elif gpus and sizes.gpus < gpus:
        found.append(("warn", f"tensor {tp} x data {dp} uses {sizes.gpus} of the host's {gpus} GPUs",
                      f"raise data_parallel to {gpus // tp} to use them all" if gpus % tp == 0 else ""))
    if shape.heads is not None and shape.heads % tp:
        found.append(("error", f"{shape.heads} attention heads do not split over tensor parallel {tp}",
                      f"use a tensor_parallel that divides {shape.heads}"))
    kv = shape.kv_heads
    if kv is not None and (tp % kv if tp >= kv else kv % tp):
        rule = f"{tp} is not a multiple of them" if tp >= kv else f"they do not split over {tp}"
        found.append(("error", f"{kv} KV heads: {rule}",
                      f"use a tensor_parallel that divides {kv} or a multiple of it"))
    if shape.experts is not None:
        if expert_parallel and shape.experts % sizes.gpus:
            found.append(("warn", f"{shape.experts} experts spread unevenly over {sizes.gpus} expert-parallel ranks",
                          f"use tensor x data ranks that divide {shape.experts}"))
        if not expert_parallel and shape.moe_intermediate is not None and shape.moe_intermediate % tp:
            found.append(("error", f"expert intermediate size {shape.moe_intermediate} does not split over tensor "
                          f"parallel {tp}", "choose another tensor_parallel or enable expert parallelism"))
    return found


def row_ranges(count: int, parts: int) -> list[tuple[int, int]]:
    """Rows 0..count-1 cut into `parts` contiguous [start, stop) ranges, the first ones one row longer.

    Deterministic (the same count and parts always give the same cut), disjoint and covering, so each
    GPU or host writes its own rows' files and together they write exactly the one-process files."""
    if parts <= 0:
        raise ValueError(f"parts must be > 0, got {parts}")
    base, extra = divmod(count, parts)
    ranges, start = [], 0
    for part in range(parts):
        stop = start + base + (1 if part < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges
