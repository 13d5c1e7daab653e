"""Check 4b: the run's parallel sizes against the host's GPUs and the target's heads and experts.

The rules are specops.planning's parallel sizes (vLLM's own); the pipeline builds its `vllm serve` flags from the
same sizes, so what the doctor passes is what will be launched.
"""

from __future__ import annotations

from pathlib import Path

from specops.doctor._model import read_json
from specops.doctor._report import Item
from specops.doctor.settings import RunSettings
from specops.planning import ModelShape, ParallelSizes, size_problems


def check_parallel(settings: RunSettings) -> list[Item]:
    if settings.tensor_parallel is None and settings.data_parallel is None:
        return []
    sizes = ParallelSizes(settings.tensor_parallel or 1, settings.data_parallel or 1)
    where = f"vllm: tensor_parallel {sizes.tensor} x data_parallel {sizes.data}"
    config = read_json(Path(settings.model_path) / "config.json") if settings.model_path else None
    shape = ModelShape.from_config(config) if config is not None else ModelShape()
    if settings.gpus is None:
        return [Item("parallel", "unknown", where, "the host's GPU count was not given: sizes not checked")]
    problems = size_problems(sizes, settings.gpus, shape, expert_parallel=settings.expert_parallel)
    if not problems:
        heads = f"{shape.heads} heads, {shape.kv_heads} KV heads" if shape.heads else "heads unknown (no config)"
        experts = f", {shape.experts} experts" if shape.experts else ""
        return [Item("parallel", "ok", where, f"fits {settings.gpus} GPU(s) and the target's {heads}{experts}")]
    return [Item("parallel", result, where, why, fix) for result, why, fix in problems]
