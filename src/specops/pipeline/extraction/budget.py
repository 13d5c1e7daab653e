"""Hidden-state bytes against a run's disk budget (`hidden_states.disk_budget_gb`).

A row's file is what `write_sample` and vLLM's connector write: a safetensors header, token_ids
int64 [seq] and hidden_states [seq, layers, hidden] in the run's dtype. Its size is known before
anything is extracted, so hybrid mode decides here how many leading rows extract may write, leaving
room for the files the trainer has in flight from the server (each deleted once loaded).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

GB = 10**9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}
HEADER_BYTES = 512  # safetensors' 8-byte length and its JSON header (two tensors: ~200 bytes), rounded up
FP8_SCALE_BYTES = 4  # backend fp8: one float32 scale per token (hs_connectors.fp8_utils)


def row_bytes(tokens: int, layers: int, hidden: int, dtype: str) -> int:
    """An upper bound of one row's file size (`dtype` as stored: fp8 adds its per-token scales)."""
    scales = FP8_SCALE_BYTES * tokens if dtype == "float8_e4m3fn" else 0
    return HEADER_BYTES + 8 * tokens + scales + tokens * layers * hidden * DTYPE_BYTES[dtype]


def budget_bytes(disk_budget_gb: float | None) -> int | None:
    return None if disk_budget_gb is None else int(disk_budget_gb * GB)


def in_flight_reserve(lengths: list[int], layers: int, hidden: int, dtype: str, in_flight: int) -> int:
    """Room for `in_flight` generated files at once (the largest rows): the server writes one per
    request and the trainer deletes it once loaded."""
    largest = sorted(lengths, reverse=True)[:max(in_flight, 1)]
    return sum(row_bytes(tokens, layers, hidden, dtype) for tokens in largest)


def rows_within(lengths: list[int], layers: int, hidden: int, dtype: str, allowance: int) -> int:
    """How many leading rows' files fit in `allowance` bytes together."""
    used = 0
    for index, tokens in enumerate(lengths):
        used += row_bytes(tokens, layers, hidden, dtype)
        if used > allowance:
            return index
    return len(lengths)


def bytes_on_disk(folders: Iterable[Path]) -> int:
    """Every file's bytes under these folders (temporaries too: they take the disk all the same)."""
    total = 0
    for folder in folders:
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_file():
                    total += entry.stat().st_size
            except OSError:
                continue  # deleted between listing and stat: the trainer discards generated files
    return total


SPECULATORS_WORKERS = 12  # speculators 0.9's --num-workers default (a GPU host; specops passes 0 on CPU)
SPECULATORS_PREFETCH = 4  # its --prefetch-factor default


def in_flight_rows(loader_workers: int | None, host_gpus: int) -> int:
    """Generated rows the trainer may hold at once: each dataloader worker prefetches its batches'
    samples; without workers (a CPU host) one request at a time."""
    workers = loader_workers if loader_workers is not None else (SPECULATORS_WORKERS if host_gpus else 0)
    return workers * SPECULATORS_PREFETCH if workers else 1
