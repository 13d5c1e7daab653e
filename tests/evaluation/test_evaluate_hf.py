"""Evaluate with the hf backend: the demo's trained draft against the untrained one, on held-out prompts.

The replay of greedy EAGLE-3 drafting (speculators' Eagle3DraftModel, the transformers target)
counts drafts and accepted tokens like vLLM's spec-decode counters; the report carries the keys
scripts rely on; held-out prompts never reach training; a second evaluation finds the first one
as `previous`; --all-epochs scores every epoch and draws acceptance length per epoch; a re-run of an
evaluated run decides to skip without loading a tokenizer, and still sees changed held-out prompts.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specops.contract import step_table
from tests.evaluation.conftest import copy_of
from tests.support.agent import agent_env, one_document
from tests.support.agent import run_agent as agent

KEYS = {"mean_acceptance_length", "acceptance_rate", "per_position_acceptance", "num_drafts", "num_draft_tokens",
        "num_accepted_tokens", "prompts", "checkpoint", "backend"}


def test_the_pipeline_ends_with_the_trained_draft_clearly_above_the_untrained_one(evaluated) -> None:
    root, summary = evaluated
    assert list(summary["steps"]) == step_table.names()  # every step of the table ran, in its order
    evaluation = summary["evaluation"]
    trained, untrained = evaluation["report"], evaluation["untrained"]
    assert KEYS <= set(trained) and KEYS <= set(untrained)
    # the default checkpoint is the run's best by the acceptance recorded after each epoch, whichever that is
    best = str(evaluation["best"]["epoch"])
    assert trained["backend"] == "hf" and trained["prompts"] == 20 and trained["checkpoint"] == best
    assert untrained["mean_acceptance_length"] < 1.05  # speculators' init proposes nearly nothing the target takes
    assert trained["mean_acceptance_length"] > untrained["mean_acceptance_length"] + 0.4
    for report in (trained, untrained):
        assert report["num_draft_tokens"] == 3 * report["num_drafts"]
        assert report["mean_acceptance_length"] == round(1 + report["num_accepted_tokens"] / report["num_drafts"], 4)
        assert report["acceptance_rate"] == round(report["num_accepted_tokens"] / report["num_draft_tokens"], 4)
        positions = report["per_position_acceptance"]
        assert len(positions) == 3 and positions == sorted(positions, reverse=True)  # a later draft needs the earlier
        assert abs(sum(positions) - report["num_accepted_tokens"] / report["num_drafts"]) < 1e-3
    plot = root / "runs" / "tiny" / "checkpoints" / "acceptance.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (plot.parent / "loss.png").is_file()


def test_held_out_prompts_are_never_trained_on(evaluated) -> None:
    import datasets
    from transformers import AutoTokenizer

    root, _summary = evaluated
    run = root / "runs" / "tiny"
    held = [json.loads(line) for line in (run / "heldout" / "prompts.jsonl").read_text().splitlines()]
    assert len(held) == 20 and all(row["messages"][-1]["role"] == "user" for row in held)
    questions = [row["messages"][-1]["content"] for row in held]
    tokenizer = AutoTokenizer.from_pretrained(str(root / "models" / "tiny-llama"))
    texts = [tokenizer.decode(ids) for ids in datasets.load_from_disk(str(run / "prepared"))["input_ids"]]
    assert len(texts) == 200
    assert not [q for q in questions if any(q in text for text in texts)]
    source = (run / "regenerated" / "source.jsonl").read_text()
    assert not [q for q in questions if json.dumps(q)[1:-1] in source]


def test_the_held_out_choice_is_by_content_whatever_the_order() -> None:
    import random

    from specops.pipeline.data import Conversation
    from specops.pipeline.data.heldout import choose

    conversations = [Conversation(n, [{"role": "user", "content": f"question {n}"},
                                      {"role": "assistant", "content": f"answer {n}"}]) for n in range(100)]
    shuffled = conversations[:]
    random.Random(7).shuffle(shuffled)
    assert choose(conversations, 10) == choose(shuffled, 10) and len(choose(conversations, 10)) == 10
    assert choose(conversations[:50], 10) != choose(conversations[50:], 10)


@pytest.mark.slow  # long: scheduled among the first (tests/support/workers.py)
def test_a_second_evaluation_skips_and_all_epochs_scores_every_epoch_beside_the_previous(evaluated, tmp_path) -> None:
    root = copy_of(evaluated, tmp_path / "w")
    first = evaluated[1]["evaluation"]["report"]
    code, again, _ = agent(root, "step", "evaluate", "--run", "tiny")
    assert code == 0 and again["status"] == "skipped: unchanged"
    assert again["report"] == first

    code, document, stderr = agent(root, "step", "evaluate", "--run", "tiny", "--all-epochs", timeout=900)
    assert code == 0, stderr[-3000:]
    assert [row["checkpoint"] for row in document["epochs"]] == ["0", "1", "2", "3"]
    by_checkpoint = {row["checkpoint"]: row for row in document["epochs"]}
    # the default (best) checkpoint scored again: the same draft, the same prompts, the same counts
    assert by_checkpoint[first["checkpoint"]] == document["report"] == first
    assert document["previous"]["mean_acceptance_length"] == first["mean_acceptance_length"]
    # the same untrained draft on the same prompts was scored by the first evaluation: not again
    untrained = evaluated[1]["evaluation"]["untrained"]
    assert document["untrained"] == {**untrained, "reused": True}
    assert document["epochs"][0]["mean_acceptance_length"] < document["epochs"][-1]["mean_acceptance_length"]
    report = json.loads((root / "runs" / "tiny" / "evaluation" / "report.json").read_text())
    assert report["epochs"] == document["epochs"]


# The step in a process of its own, which then says whether it imported transformers (the tokenizer).
EVALUATE_AND_TELL = """
import json, sys
from specops.pipeline.data import open_run
from specops.pipeline.engine import enter
from specops.pipeline.evaluation.step import evaluate
context = enter(open_run("tiny"))
document = evaluate(context.run, context.settings)
print(json.dumps({"status": document["status"], "prompts": document["report"]["prompts"],
                  "transformers": "transformers" in sys.modules}))
"""


@pytest.mark.slow  # long: scheduled among the first (tests/support/workers.py)
def test_a_re_run_decides_without_a_tokenizer_and_still_sees_changed_prompts(evaluated, tmp_path) -> None:
    root = copy_of(evaluated, tmp_path / "w")

    def evaluate() -> dict:
        done = subprocess.run([sys.executable, "-c", EVALUATE_AND_TELL], cwd=root, env=agent_env(root),
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        return one_document(done.stdout, done.stderr)

    assert evaluate() == {"status": "skipped: unchanged", "prompts": 20, "transformers": False}
    prompts_file = root / "runs" / "tiny" / "heldout" / "prompts.jsonl"
    prompts_file.write_text("".join(prompts_file.read_text().splitlines(keepends=True)[:-1]))  # one prompt fewer
    assert evaluate() == {"status": "done", "prompts": 19, "transformers": True}
    assert evaluate() == {"status": "skipped: unchanged", "prompts": 19, "transformers": False}


def test_fewer_prompts_and_a_checkpoint_by_number(evaluated, tmp_path) -> None:
    root = copy_of(evaluated, tmp_path / "w")
    code, document, stderr = agent(root, "step", "evaluate", "--run", "tiny", "--checkpoint", "1", "--prompts", "5",
                                   timeout=900)
    assert code == 0, stderr[-3000:]
    assert document["report"]["checkpoint"] == "1" and document["report"]["prompts"] == 5
    assert document["untrained"]["prompts"] == 5 and "reused" not in document["untrained"]  # other prompts
    code, document, _ = agent(root, "step", "evaluate", "--run", "tiny", "--checkpoint", "9")
    assert code == 2 and "epoch 9 has no finished checkpoint" in document["error"]
    assert "\n" not in document["error"]


def test_prompts_drafted_together_count_what_each_prompt_drafted_alone_counts(evaluated, monkeypatch) -> None:
    import torch

    from specops.pipeline.evaluation import replay as replay_module
    from specops.pipeline.evaluation.step import heldout_token_ids
    from specops.pipeline.run import Run
    from specops.pipeline.target import load_target

    root, summary = evaluated
    monkeypatch.setenv("SPECOPS_WORKDIR", str(root))
    run = Run("tiny", root)
    prompts = heldout_token_ids(run, 8)
    target = load_target(run, torch.device("cpu"), torch.float32)
    draft = root / "runs" / "tiny" / "checkpoints" / summary["evaluation"]["report"]["checkpoint"]
    together = replay_module.replay(run, draft, prompts, 3, 64, target=target)
    monkeypatch.setattr(replay_module, "ANSWER_BATCH", 1)
    alone = replay_module.replay(run, draft, prompts, 3, 64, target=target)
    assert together == alone
    assert together["num_accepted_tokens"] > 0 and together["generated_tokens"] > 8
