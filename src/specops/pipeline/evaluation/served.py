"""The `vllm` backend of evaluate: the held-out prompts against a real server, and what it counted.

The prompts go as token ids to /v1/completions (the same ids the hf replay uses), one at a time,
greedy, `max_tokens` each. The acceptance figures come from the server itself: per request from
the response's `metrics.speculative_decoding` where the installed vLLM gives it (served with
`--per-request-spec-decode-metrics summary`), and always from the deltas of its Prometheus
counters around the requests (`vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`,
`..._num_accepted_tokens_total`, `..._num_accepted_tokens_per_pos_total{position=...}`); the
server is this run's own job, so no other traffic moves them. The same prompts against the
target alone give tokens/s without speculation.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from typing import Any

PER_REQUEST_FLAG = "--per-request-spec-decode-metrics"
_SAMPLE = re.compile(r'^(vllm:spec_decode_[a-z_]+?)(?:_total)?(\{[^}]*\})?\s+([0-9.eE+-]+)$')
_POSITION = re.compile(r'position="(\d+)"')


def scrape(endpoint: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """The spec-decode counters of the server's /metrics, summed over engines."""
    with urllib.request.urlopen(f"{endpoint}/metrics", timeout=timeout_s) as response:
        text = response.read().decode()
    counters: dict[str, Any] = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0,
                                "per_position": {}}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        found = _SAMPLE.match(line.strip())
        if not found or line.split("{")[0].split(" ")[0].endswith("_created"):
            continue
        name, labels, value = found.group(1), found.group(2) or "", float(found.group(3))
        key = name.removeprefix("vllm:spec_decode_")
        if key == "num_accepted_tokens_per_pos":
            position = _POSITION.search(labels)
            if position:
                slot = int(position.group(1))
                counters["per_position"][slot] = counters["per_position"].get(slot, 0.0) + value
        elif key in counters:
            counters[key] += value
    return counters


def delta(before: dict[str, Any], after: dict[str, Any], k: int) -> dict[str, Any]:
    positions = [round(after["per_position"].get(p, 0.0) - before["per_position"].get(p, 0.0)) for p in range(k)]
    return {"num_drafts": round(after["num_drafts"] - before["num_drafts"]),
            "num_draft_tokens": round(after["num_draft_tokens"] - before["num_draft_tokens"]),
            "num_accepted_tokens": round(after["num_accepted_tokens"] - before["num_accepted_tokens"]),
            "accepted_per_position": positions}


def complete(endpoint: str, model: str, prompt: list[int], max_tokens: int, timeout_s: float = 600.0) -> dict:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "return_token_ids": True}).encode()
    request = urllib.request.Request(f"{endpoint}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def per_request_counts(responses: list[dict[str, Any]], k: int) -> dict[str, Any] | None:
    """Sum of the responses' own spec-decode metrics; None when the server gave none."""
    found = [((r.get("metrics") or {}).get("speculative_decoding")) for r in responses]
    if not found or any(item is None for item in found):
        return None
    histogram = [0] * (k + 1)
    drafts = draft_tokens = accepted = 0
    for item in found:
        for j, count in enumerate(item["acceptance_histogram"][: k + 1]):
            histogram[j] += count
        drafts += item["num_spec_steps"]
        draft_tokens += item["num_draft_tokens"]
        accepted += item["num_accepted_draft_tokens"]
    # A step that accepted j drafts accepted positions 0..j-1.
    positions = [sum(histogram[j] for j in range(p + 1, k + 1)) for p in range(k)]
    return {"num_drafts": drafts, "num_draft_tokens": draft_tokens, "num_accepted_tokens": accepted,
            "accepted_per_position": positions}


def settled(endpoint: str, before: dict[str, Any], k: int, expected: dict[str, Any] | None,
            timeout_s: float = 30.0, poll_s: float = 0.25) -> dict[str, Any]:
    """The counter deltas since `before` once the server has folded in every finished request: the
    API process takes the engine's stats in on its own interval, so read until the deltas reach
    the responses' own totals (`expected`), or, without those, until two reads agree."""
    deadline = time.monotonic() + timeout_s
    last = None
    if expected is None:
        time.sleep(0.5)  # at least one of the API process's intervals
    while True:
        counters = delta(before, scrape(endpoint), k)
        if expected is not None and counters["num_drafts"] >= expected["num_drafts"]:
            return counters
        if expected is None and counters == last:
            return counters
        if time.monotonic() > deadline:
            return counters
        last = counters
        time.sleep(poll_s)


def run_prompts(endpoint: str, model: str, prompts: list[list[int]], max_tokens: int, k: int,
                speculative: bool, concurrency: int = 1) -> dict[str, Any]:
    """Send the prompts, `concurrency` in flight; counts (with speculation), tokens and tokens/s."""
    from concurrent.futures import ThreadPoolExecutor

    before = scrape(endpoint) if speculative else None
    started = time.perf_counter()
    if concurrency == 1:
        responses = [complete(endpoint, model, prompt, max_tokens) for prompt in prompts]
    else:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            responses = list(pool.map(lambda prompt: complete(endpoint, model, prompt, max_tokens), prompts))
    seconds = time.perf_counter() - started
    tokens = sum(int((response.get("usage") or {}).get("completion_tokens") or 0) for response in responses)
    result: dict[str, Any] = {"generated_tokens": tokens, "seconds": round(seconds, 3),
                              "tokens_per_s": round(tokens / seconds, 2) if seconds > 0 else None,
                              "concurrency": concurrency,
                              "outputs": [(r["choices"][0].get("token_ids") or []) for r in responses]}
    if speculative:
        result["per_request"] = per_request_counts(responses, k)
        result["counters"] = settled(endpoint, before, k, result["per_request"])
    return result
