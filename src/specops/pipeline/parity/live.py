"""One real request through the serving path with the untrained draft: the run's vLLM server job with
`--speculative-config {"method": "eagle3", "model": DRAFT, ...}`, one greedy completion, and the server's
own word on it: its spec-decode counters moved (the draft really drafted) and the auxiliary layers its
log says it captures ("Using auxiliary layers from speculative config: (...)") are the ones training used.
The server is stopped afterwards: training needs the GPUs (and a CPU host its cores).
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.pipeline.parity.checks import Trained
from specops.pipeline.parity.vllm_reading import VllmReading

if TYPE_CHECKING:
    from specops.pipeline.run import Run

PROMPT = "The draft model proposes tokens and the target model"
MAX_TOKENS = 16
COUNTER_WAIT_S = 15.0  # the API process folds the engine's counters in on its logging interval
_DRAFTS = re.compile(r"^vllm:spec_decode_num_drafts(?:_total)?(?:\{[^}]*\})?\s+([0-9.eE+-]+)$")
_AUX_LOG = re.compile(r"Using auxiliary layers from speculative config: \(([\d,\s]*)\)")


def _drafts(endpoint: str) -> float:
    with urllib.request.urlopen(f"{endpoint}/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(float(found.group(1)) for line in text.splitlines() if (found := _DRAFTS.match(line.strip())))


def _complete(endpoint: str, model: str) -> dict[str, Any]:
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0}).encode()
    request = urllib.request.Request(f"{endpoint}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def logged_aux_layers(log: Path) -> list[int] | None:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = _AUX_LOG.findall(text)
    return [int(part) for part in found[-1].split(",") if part.strip()] if found else None


def one_request(run: Run, draft: Path, trained: Trained, reading: VllmReading) -> dict[str, Any]:
    from specops.pipeline.vllm import generating_server, serving_config, stop_generating_server

    k = run.config.evaluate.num_speculative_tokens
    server = generating_server(run, speculative=serving_config(draft, k))
    try:
        before = _drafts(server["endpoint"])
        response = _complete(server["endpoint"], server["model"])
        deadline = time.monotonic() + COUNTER_WAIT_S
        drafts = _drafts(server["endpoint"]) - before
        while drafts <= 0 and time.monotonic() < deadline:
            time.sleep(0.5)
            drafts = _drafts(server["endpoint"]) - before
        logged = logged_aux_layers(Path(server["log"]))
    finally:
        stopped = stop_generating_server(server, "the parity gate's request is done")
    result = {"ok": True, "job": server["job"], "vllm_version": server.get("vllm_version"),
              "num_drafts": round(drafts), "text": response["choices"][0].get("text"),
              "logged_aux_layers": logged, "stopped": stopped}
    if drafts <= 0:
        result.update(ok=False, why=f"method: training used {trained.speculator_type}, the server drafted nothing "
                                    f"for one request (vLLM {server.get('vllm_version')}, log {server['log']})")
    elif logged is not None and logged != trained.aux_layers:
        result.update(ok=False, why=f"eagle_aux_hidden_state_layer_ids: training used {trained.aux_layers}, "
                                    f"serving uses {logged} (the server's log, {server['log']})")
    return result
