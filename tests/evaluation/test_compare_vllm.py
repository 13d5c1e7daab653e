"""`evaluate --compare none,ngram,suffix,eagle3` with the vllm backend against real vLLM CPU servers (the demo's
finished run, its last checkpoint): one server per servable kind, all with the same flags but the speculator;
a kind the serve env cannot serve (suffix without arctic_inference) is one line and no load; the speedups are
each kind's tokens/s over `none`'s at the same concurrency, and the best is the fastest at each.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from specops.doctor import interpreter_path, training_free_support
from tests.evaluation.conftest import copy_of
from tests.support.agent import agent_env
from tests.vllm.conftest import VLLM_PYTHON, free_port, in_vllm_worker, needs_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm, in_vllm_worker]

PROMPTS, MAX_TOKENS, K = 2, 12, 3


def _settings(command: str) -> list[str]:
    """A server's argv without its speculator (the flags every kind must share)."""
    argv = shlex.split(command)
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--speculative-config", "--per-request-spec-decode-metrics"):
            skip = True
        else:
            kept.append(arg)
    return kept


def test_kinds_are_compared_on_the_same_prompts_one_server_each(evaluated, patched_vllm, tmp_path) -> None:
    root = copy_of(evaluated, tmp_path / "w")
    config = root / "runs" / "tiny.yaml"
    config.write_text(config.read_text().replace("port: 8000", f"port: {free_port()}")
                      .replace("  max_tokens: 64", f"  max_tokens: {MAX_TOKENS}"))
    # a two-turn MT-Bench-shaped set: its second turn asked after the server's own first answer
    (root / "mt.jsonl").write_text(json.dumps({"turns": ["Name three colours.", "Now three more."]}) + "\n")
    env = {**agent_env(root), "SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON)}
    done = subprocess.run([sys.executable, "-m", "specops", "step", "evaluate", "--run", "tiny", "--backend", "vllm",
                           "--compare", "none,ngram,suffix,eagle3", "--concurrency", "1,2", "--rounds", "2",
                           "--checkpoint", "last", "--prompts", str(PROMPTS), "--set", "mt=mt.jsonl"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    compared = json.loads(done.stdout.strip().splitlines()[-1])["compare"]
    rows = {row["label"]: row for row in compared["rows"]}
    assert list(rows) == ["none", "ngram", "suffix", "eagle3"]
    assert compared["prompts"] == PROMPTS and compared["concurrency"] == [1, 2]

    # suffix: what the doctor reads in the serve env decides it before any load
    suffix = training_free_support(interpreter_path(str(VLLM_PYTHON)))["suffix"]
    if suffix.servable is False:
        assert rows["suffix"]["unavailable"] == f"not servable here: {suffix.why} ({suffix.fix})"
        assert not rows["suffix"].get("speed") and "suffix: not servable here" in done.stderr
    else:  # arctic_inference in the serve env (scripts/setup-suffix.sh): suffix decoding served like n-gram, from
        # each prompt's own tree: the rounds repeat the prompts, and its tree of past answers would replay them
        assert rows["suffix"]["speculative_config"] == {"method": "suffix", "num_speculative_tokens": K,
                                                        "suffix_decoding_max_cached_requests": 0}
        assert rows["suffix"]["speed"] and rows["suffix"]["acceptance"]["heldout"]["prompts"] == PROMPTS
    served = [label for label in rows if not rows[label]["unavailable"]]
    assert [server["label"] for server in compared["servers"]] == served  # one load per servable kind
    assert len({server["job"] for server in compared["servers"]}) == len(served)
    settings = [_settings(server["command"]) for server in compared["servers"]]
    assert all(argv == settings[0] for argv in settings)  # the same server but for the speculator

    assert rows["none"]["speculative_config"] is None and not rows["none"]["acceptance"]
    assert rows["ngram"]["speculative_config"] == {"method": "ngram", "num_speculative_tokens": K,
                                                   "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert rows["eagle3"]["speculative_config"]["method"] == "eagle3"
    for label in ("ngram", "eagle3"):
        heldout = rows[label]["acceptance"]["heldout"]
        assert heldout["num_drafts"] > 0 and heldout["prompts"] == PROMPTS
        assert heldout["mean_acceptance_length"] == round(1 + heldout["num_accepted_tokens"] / heldout["num_drafts"], 4)
        assert len(heldout["per_position_acceptance"]) == K
        mt = rows[label]["acceptance"]["mt"]  # both turns, through this kind's own server
        assert mt["prompts"] == 2 and mt["num_drafts"] > 0 and mt["backend"] == "vllm"
    base = {cell["concurrency"]: cell["tokens_per_s"] for cell in rows["none"]["speed"]}
    for label in served:
        for cell in rows[label]["speed"]:
            assert cell["tokens_per_s"] > 0 and cell["generated_tokens"] > 0
            assert len(cell["rounds"]) == 2 and cell["tokens_per_s"] == round(sum(cell["rounds"]) / 2, 2)  # median
            assert cell["speedup"] == round(cell["tokens_per_s"] / base[cell["concurrency"]], 3)
    for best in compared["best"]:  # the fastest at each concurrency, its margin over the next
        rates = sorted(((cell["tokens_per_s"], label) for label in served for cell in rows[label]["speed"]
                        if cell["concurrency"] == best["concurrency"]), reverse=True)
        assert (best["tokens_per_s"], best["label"]) == rates[0]
        assert best["runner_up"] == rates[1][1] and best["margin"] == round(rates[0][0] / rates[1][0] - 1, 4)

    evaluation = root / "runs" / "tiny" / "evaluation"
    assert json.loads((evaluation / "compare.json").read_text())["rows"] == compared["rows"]
    assert (evaluation / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "best at concurrency 1:" in done.stderr  # the table, in the job's log too
