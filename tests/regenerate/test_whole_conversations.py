"""More signal from the same data (issue 58), opted into by the run config, on the tiny target with the hf backend:
`regenerate.max_tokens: max_seq_len` lets an answer run until its row fills the run's max_seq_len, and
`regenerate.long_prompts: shorten` asks every turn of a conversation in context (the target's own earlier answers),
a prompt too long for max_seq_len shortened by whole turns from the front, the system turn kept. Without them a
run answers as it always did: a fixed answer length, and a conversation ends once its row is past it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
LONG = " ".join(["tell me about the weather and the sea"] * 4)


def _conversation(turns: int) -> list[dict[str, str]]:
    messages = [SYSTEM]
    for number in range(turns):
        messages += [{"role": "user", "content": f"question {number}: {LONG}"},
                     {"role": "assistant", "content": "the data's own answer, never used"}]
    return messages


@pytest.fixture(scope="module")
def generator(regen_workdir: Path) -> Any:
    """The tiny target's generator (the run's settings are read at each call: the tests set them)."""
    from specops.pipeline.regenerate.hf import Generator
    from specops.pipeline.run import Run

    return Generator(Run("tiny", regen_workdir))


def _answer(generator: Any, max_seq_len: int, messages: list[dict[str, str]], **regenerate: Any) -> tuple[list, list]:
    generator.max_seq_len = max_seq_len
    generator.settings = generator.settings.model_copy(update={"max_tokens": 24, "long_prompts": "drop", **regenerate})
    return generator.batch([(0, {"id": "c0", "messages": messages})], seed=0)


def test_by_default_one_fixed_length_answer_and_the_conversation_ends_past_it(generator) -> None:
    rows, errors = _answer(generator, 160, _conversation(3))
    assert not errors and len(rows) == 1  # its row is past 24 tokens: speculators' rule ends the conversation
    assert sum(rows[0]["loss_mask"]) <= 24


def test_whole_answers_fill_the_rows_and_every_turn_is_asked_shortened_from_the_front(generator) -> None:
    max_seq_len = 160
    rows, errors = _answer(generator, max_seq_len, _conversation(3), max_tokens="max_seq_len",
                           long_prompts="shorten")
    assert not errors and len(rows) == 3  # every question asked
    for row in rows:
        assert len(row["input_ids"]) <= max_seq_len
        if row["metadata"]["finish_reason"] == "length":  # an answer stops only where its row is full
            assert len(row["input_ids"]) == max_seq_len
    assert sum(sum(row["loss_mask"]) for row in rows) > 3 * 24  # more loss tokens than fixed answers give
    last = rows[-1]["text"]
    assert "terse assistant" in last and "question 2" in last  # the system turn and the question kept
    assert "question 0" not in last  # the first question and its answer dropped to make room


def test_a_first_question_too_long_alone_still_fails_its_conversation(generator) -> None:
    rows, errors = _answer(generator, 40, _conversation(2), max_tokens="max_seq_len", long_prompts="shorten")
    assert rows == [] and "leaves no answer within max_seq_len 40" in errors[0]["metadata"]["error"]


def test_the_vllm_backend_refuses_what_only_hf_answers_in_one_line(regen_workdir: Path) -> None:
    from specops.contract.errors import BadInput
    from specops.pipeline.run import Run, resolve

    run = Run("tiny", regen_workdir)
    run.config.regenerate = run.config.regenerate.model_copy(update={"long_prompts": "shorten"})
    with pytest.raises(BadInput, match=r"runs/tiny.yaml: regenerate.long_prompts: shorten: answered by the hf "
                                       r"backend only"):
        resolve(run, regenerate="vllm", gpus=0)
