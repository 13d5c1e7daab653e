"""`evaluate --sweep`: the draft's acceptance (and, served by vLLM, its speed) over speculative settings.

sweep(run, tokens=[1, 2, 3, 4, 5], concurrency=[1, 8]) scores one checkpoint (the run's
evaluate.checkpoint unless named; best as the evaluate step chooses it) on the held-out prompts,
once per cell (number of speculative tokens k, requests in flight c), and writes
<run>/evaluation/sweep.json and sweep.png (beside acceptance.png). The document's keys are in the
README ("evaluate --sweep").

vllm: the speculative tokens are a server flag, so one server per k (the run's `vllm-server` job,
launched with the draft as the target's EAGLE-3 speculator), and one server of the target alone
for the tokens/s without speculation at each c. A cell's counts are the deltas of the server's own
`vllm:spec_decode_*` counters around its requests (this run's server: no other traffic moves them).
hf: the replay (greedy drafting with the target's continuation computed once for every k); the
acceptance only, so one concurrency.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput, as_bad_input
from specops.contract.progress import speaker
from specops.host import atomic

if TYPE_CHECKING:
    from specops.pipeline.run import EffectiveSettings, Run

SWEEP_FILE = "sweep.json"
SWEEP_PLOT = "sweep.png"


say = speaker("evaluate")


def parse_sweep(text: str) -> list[int]:
    """`num_speculative_tokens=1,2,3` -> [1, 2, 3] (bad input: one line naming what is wrong)."""
    from specops.contract.values import sweep_setting

    return as_bad_input(sweep_setting, text)


def parse_counts(text: str, flag: str) -> list[int]:
    """`1,8` -> [1, 8]: whole numbers > 0, each once, in the order given."""
    from specops.contract.values import positive_list

    return as_bad_input(positive_list, text, flag)


def _cell(k: int, concurrency: int, counts: dict[str, Any], prompts: int, checkpoint: str,
          backend: str) -> dict[str, Any]:
    from specops.pipeline.evaluation.report import figures

    return {"num_speculative_tokens": k, "concurrency": concurrency,
            **figures(counts, prompts, checkpoint, backend)}


def sweep(run: Run, effective: EffectiveSettings, tokens: list[int], concurrency: list[int] | None = None,
          checkpoint: str | None = None, prompts: int | None = None) -> dict[str, Any]:
    """`effective`: the run's settings, made where the engine was entered (with evaluate's --backend)."""
    from specops.pipeline.evaluation.prompts import heldout_token_ids
    from specops.pipeline.evaluation.step import chosen_checkpoint

    for note in effective.notes:
        say(note)
    backend = effective.evaluate_backend
    concurrency = concurrency or [1]
    if backend == "hf" and concurrency != [1]:
        raise BadInput("--concurrency: the hf backend replays the drafting and measures acceptance only "
                       "(no requests in flight); use --backend vllm for speed at several concurrencies")
    folder, best = chosen_checkpoint(run, checkpoint or run.config.evaluate.checkpoint)
    token_ids = heldout_token_ids(run, prompts)
    from specops.pipeline.parity import before_evaluation

    parity = before_evaluation(run, folder, effective)  # as before every evaluation: one line and exit 1 on a mismatch
    max_tokens = run.config.evaluate.max_tokens
    say(f"sweep of checkpoint {folder.name}: num_speculative_tokens {tokens}, concurrency {concurrency}, "
        f"{len(token_ids)} held-out prompts, {max_tokens} tokens each, backend {backend}")
    started = time.time()
    if backend == "hf":
        cells, base, servers = _sweep_hf(run, folder, token_ids, tokens, max_tokens), [], []
    else:
        cells, base, servers = _sweep_vllm(run, folder, token_ids, tokens, concurrency, max_tokens)
    document = {"backend": backend, "checkpoint": folder.name, "checkpoint_path": str(folder), "best": best,
                "prompts": len(token_ids), "max_tokens": max_tokens, "num_speculative_tokens": tokens,
                "concurrency": concurrency, "cells": cells, "base": base, "started_at": started,
                "seconds": round(time.time() - started, 2), "servers": servers,
                "parity": {key: parity.get(key) for key in ("draft", "ok", "vllm")}}
    from specops.pipeline.evaluation.plot import plot_sweep

    document["plot"] = str(plot_sweep(document, run.paths.checkpoints / SWEEP_PLOT,
                                      title=f"{run.paths.name}: checkpoint {folder.name}, "
                                            f"{len(token_ids)} held-out prompts ({backend})"))
    atomic.write_json(run.paths.evaluation / SWEEP_FILE, document)
    return document


def _sweep_hf(run: Run, folder: Path, token_ids: list[list[int]], tokens: list[int],
              max_tokens: int) -> list[dict[str, Any]]:
    from specops.pipeline.evaluation.replay import replay
    from specops.pipeline.evaluation.report import summary_line
    from specops.pipeline.target import choose_device, load_target

    target = load_target(run, *choose_device(run.config.dtype))
    kept: dict[str, Any] = {"answers": {}, "states": {}}  # the target's work, the same for every k
    cells = []
    for k in tokens:
        counts = replay(run, folder, token_ids, k, max_tokens, target=target, **kept)
        cell = {**_cell(k, 1, counts, len(token_ids), folder.name, "hf"),
                "generated_tokens": counts["generated_tokens"]}
        say(summary_line(f"k={k}", cell))
        cells.append(cell)
    return cells


def _sweep_vllm(run: Run, folder: Path, token_ids: list[list[int]], tokens: list[int], concurrency: list[int],
                max_tokens: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    from specops.pipeline.evaluation.report import summary_line, with_speed
    from specops.pipeline.evaluation.served import run_prompts
    from specops.pipeline.vllm import generating_server, speculative_config

    servers: list[dict[str, Any]] = []
    server = generating_server(run)
    servers.append(server)
    base = []
    for c in concurrency:
        result = run_prompts(server["endpoint"], server["model"], token_ids, max_tokens, 1, speculative=False,
                             concurrency=c)
        base.append({"concurrency": c, "tokens_per_s": result["tokens_per_s"],
                     "generated_tokens": result["generated_tokens"], "seconds": result["seconds"]})
        say(f"target alone, concurrency {c}: {result['tokens_per_s']} tokens/s")
    base_speed = {row["concurrency"]: row["tokens_per_s"] for row in base}
    cells = []
    for k in tokens:
        server = generating_server(run, speculative=speculative_config(folder, k))  # the draft's kind says how
        servers.append(server)
        for c in concurrency:
            result = run_prompts(server["endpoint"], server["model"], token_ids, max_tokens, k, speculative=True,
                                 concurrency=c)
            cell = with_speed(_cell(k, c, result["counters"], len(token_ids), folder.name, "vllm"),
                              result["tokens_per_s"], base_speed[c])
            cell.update(counts_from="metrics_deltas", per_request=result["per_request"],
                        generated_tokens=result["generated_tokens"], seconds=result["seconds"])
            say(summary_line(f"k={k}, concurrency {c}", cell))
            cells.append(cell)
    described = [{key: s.get(key) for key in ("job", "reused", "port", "vllm_version", "ready_s")} for s in servers]
    return cells, base, described
