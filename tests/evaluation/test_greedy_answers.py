"""The hf evaluation asks the target for its greedy answers once, in left-padded batches: each row of a
batch is exactly the answer the target gives that prompt alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.repo import REPO


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory: pytest.TempPathFactory):
    import torch

    from specops.pipeline.data import generate_tiny
    from specops.pipeline.run import Run
    from specops.pipeline.target import load_target

    root: Path = tmp_path_factory.mktemp("greedy")
    (root / "runs").mkdir()
    (root / "runs" / "tiny.yaml").write_text((REPO / "runs" / "tiny.yaml").read_text())
    generate_tiny(root)
    run = Run("tiny", root)
    return run, load_target(run, torch.device("cpu"), torch.float32)


def test_a_batch_of_answers_is_each_prompts_own_greedy_answer(tiny_target) -> None:
    import torch

    from specops.pipeline.data import load_tokenizer, render_ids
    from specops.pipeline.evaluation.replay import greedy_answers

    run, target = tiny_target
    tokenizer = load_tokenizer(run)
    conversations = [[{"role": "user", "content": text}] for text in
                     ("hi", "tell me about the weather in the mountains today", "count: one two three four five six",
                      "why", "a longer question about trains, boats and the sea, with commas, and more words")]
    prompts = [render_ids(tokenizer, messages, generation_prompt=True) for messages in conversations]
    assert len({len(prompt) for prompt in prompts}) == len(prompts)  # every row padded differently
    eos, pad, cpu = tokenizer.eos_token_id, tokenizer.pad_token_id, torch.device("cpu")
    alone = [greedy_answers(target, [prompt], 24, eos, pad, cpu)[0] for prompt in prompts]
    assert greedy_answers(target, prompts, 24, eos, pad, cpu) == alone
    assert all(answer for answer in alone)
    for answer in alone:  # cut after the end-of-turn token, which is kept
        assert eos not in answer[:-1]
