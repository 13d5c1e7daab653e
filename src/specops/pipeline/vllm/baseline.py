"""The target-alone speed (tokens/s without speculation), measured on a server the run starts anyway.

The speedup evaluation reports is the draft-speculating server's tokens/s over the target alone's. The
target alone used to be a server load of its own in evaluate (18 minutes at Kimi scale, for one figure).
Instead the extract step, its server up and its files written, sends evaluation's held-out prompts to
that same server at evaluation's settings (token ids to /v1/completions, one at a time, greedy,
`evaluate.max_tokens` each) and records the rate here, keyed by what it is a function of (the target,
the prompts' ids, max tokens, the serve args and vLLM's version). evaluate takes it when the key
matches; else it reports that the speedup was not measured, unless the run asks for a server of its
own (`evaluate.baseline_server: true`).

How honest it is: that server is the extraction server (vLLM's `extract_hidden_states` method and
its connector), which also runs the method's cache-only layer every step and writes each request's
prompt hidden states; bench/loads.py prints its rate beside a dedicated target-alone server's on the
tiny run (0.78 of it on the 2-core CPU machine, loaded: the speedup reads ~1.3x high there; on a large
target the per-step overhead is a far smaller share of a forward, not measured yet), and
bench/baseline.py interleaves the two. The report names where its baseline came from
(`speedup_baseline.how`); `evaluate.baseline_server: true` measures on a server of its own (a load).
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.host import atomic

if TYPE_CHECKING:
    from specops.pipeline.run import Run

BASELINE_FILE = "served_baseline.json"
HOW = ("the run's extraction server, during the extract step (no load of its own; its captures cost time, so the "
       "target alone may read slower there than on a dedicated server and the speedup higher: on the tiny CPU run "
       "0.78 of a dedicated server's rate, bench/loads.py; evaluate.baseline_server: true measures on a server "
       "of its own)")


def baseline_key(run: Run, prompts: list[list[int]], max_tokens: int, vllm_version: str | None) -> str:
    from specops.pipeline.run import model_digest

    return hashlib.sha256(json.dumps({
        "model_digest": model_digest(run.model_path), "prompts": prompts, "max_tokens": max_tokens,
        "serve_args": list(run.config.vllm.serve_args), "vllm_version": vllm_version}, sort_keys=True,
    ).encode()).hexdigest()


def _complete(endpoint: str, model: str, prompt: list[int], max_tokens: int) -> int:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}).encode()
    request = urllib.request.Request(f"{endpoint}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600.0) as response:
        document = json.loads(response.read())
    return int((document.get("usage") or {}).get("completion_tokens") or 0)


def measure(run: Run, endpoint: str, model: str, prompts: list[list[int]], max_tokens: int,
            vllm_version: str | None, job: str, *, plain: bool = False,
            sets: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Send the prompts one at a time; the record written (and returned). `plain`: the server is the target alone
    (regenerate's own), nothing captured: a rate evaluate takes even where it would load a server of its own;
    `sets`: the target alone's rate on each benchmark set, measured on the same server (set_key in each)."""
    import contextlib

    from specops.pipeline.vllm.captures import Discarded
    from specops.pipeline.vllm.command import staging_dir

    with contextlib.nullcontext() if plain else Discarded(staging_dir(run)):
        started = time.perf_counter()
        tokens = sum(_complete(endpoint, model, prompt, max_tokens) for prompt in prompts)
        seconds = time.perf_counter() - started
    record = {"key": baseline_key(run, prompts, max_tokens, vllm_version),
              "tokens_per_s": round(tokens / seconds, 2) if seconds > 0 else None, "generated_tokens": tokens,
              "seconds": round(seconds, 3), "prompts": len(prompts), "max_tokens": max_tokens,
              "how": OWN_HOW if plain else HOW, "plain": plain, "job": job, "vllm_version": vllm_version,
              "at": time.time()}
    if sets is not None:
        record["sets"] = sets
    atomic.write_json(run.paths.run_dir / BASELINE_FILE, record)
    return record


OWN_HOW = ("the regenerate step's own server (the target alone, nothing captured: regenerate.server own), measured "
           "before it stopped; evaluate loads no server for it")


def set_key(run: Run, path: Path, limit: int | None, max_tokens: int, vllm_version: str | None) -> str:
    """What the target alone's rate on one benchmark set is a function of."""
    from specops.pipeline.run import file_digest, model_digest

    return hashlib.sha256(json.dumps({
        "model_digest": model_digest(run.model_path), "set": file_digest(path), "limit": limit,
        "max_tokens": max_tokens, "serve_args": list(run.config.vllm.serve_args), "vllm_version": vllm_version},
        sort_keys=True).encode()).hexdigest()


def recorded_sets(run: Run, record: dict[str, Any], sets: dict[str, Path], limit: int | None, max_tokens: int,
                  vllm_version: str | None) -> dict[str, dict[str, Any]] | None:
    """The record's rates on exactly these sets at these settings (every one, or None)."""
    kept = record.get("sets") or {}
    found = {}
    for name, path in sets.items():
        entry = kept.get(name)
        if not entry or entry.get("key") != set_key(run, path, limit, max_tokens, vllm_version):
            return None
        found[name] = {key: value for key, value in entry.items() if key != "key"}
    return found


def recorded(run: Run, prompts: list[list[int]], max_tokens: int, vllm_version: str | None) -> dict[str, Any] | None:
    """The baseline measured for exactly these prompts and settings, None when there is none."""
    path: Path = run.paths.run_dir / BASELINE_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("key") == baseline_key(run, prompts, max_tokens, vllm_version) else None
