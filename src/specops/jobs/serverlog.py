"""How far a vLLM server's load has come, read from its own log (standard library only: the jobs layer's
status and the pipeline's readiness gate both read it).

A load of a large target takes many minutes (18 for Kimi-K2.5 on 8 GPUs); "starting" then "ready" says
nothing in between. vLLM logs its milestones: the config resolved, the weights' shards read (a progress
bar), the draft loaded, the KV cache sized, torch.compile and CUDA-graph capture, the engine initialised,
the API server listening. `load_stage` names the latest one found in the log's tail.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

TAIL_BYTES = 256 * 1024

# (pattern, what it means); the latest match in the log wins. Wording of vLLM 0.11 ... 0.33.
STAGES: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(pattern), label) for pattern, label in (
    (r"Resolved architecture: (\S+)", "config read ({0})"),
    (r"Starting to load model", "reading the weights"),
    (r"Loading safetensors checkpoint shards:\s+(\d+)% Completed \| (\d+)/(\d+)", "weights read: {1}/{2} shards"),
    # (its seconds are left out: for a draft without weights of its own, vLLM 0.32 logs nonsense there)
    (r"Loading weights took [0-9.]+ seconds", "weights read"),
    (r"Model loading took ([0-9.]+) GiB(?: memory)? and ([0-9.]+) seconds", "weights read ({0} GiB in {1} s)"),
    (r"Loading drafter model", "reading the draft's weights"),
    (r"KV cache size: ([0-9,]+) tokens", "KV cache: {0} tokens"),
    (r"Available KV cache memory: ([0-9.]+) GiB", "KV cache: {0} GiB"),
    (r"torch\.compile takes ([0-9.]+) s", "compiled ({0} s)"),
    (r"Compiling a graph for|Dynamo bytecode transform", "compiling (torch.compile)"),
    (r"Capturing CUDA graphs", "capturing CUDA graphs"),
    (r"Graph capturing finished in ([0-9.]+) secs", "CUDA graphs captured ({0} s)"),
    (r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+)", "engine ready ({0} s)"),
    (r"Starting vLLM (?:API )?server on", "API server starting"),
    (r"Application startup complete", "API server up"),
))


def tail_text(log: Path, size: int = TAIL_BYTES) -> str:
    try:
        with log.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - size))
            return handle.read().decode(errors="replace").replace("\r", "\n")
    except OSError:
        return ""


def load_stage(log: Path) -> str | None:
    """The latest load milestone in the server's log, in words; None before the first one."""
    latest: tuple[int, str] | None = None
    text = tail_text(log)
    for pattern, label in STAGES:
        for found in pattern.finditer(text):
            if latest is None or found.start() >= latest[0]:
                latest = (found.start(), label.format(*found.groups()))
    return latest[1] if latest else None
