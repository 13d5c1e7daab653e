"""Step 1, prepare: loss masks, the speculators-format dataset, malformed records, skipping."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specops.pipeline.data import tiny, tokenise_with_mask
from tests.support.agent import run_agent as agent

from .conftest import copy_workdir, in_workdir


@pytest.fixture(scope="module")
def tokenizer(tiny_workdir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_workdir / tiny.MODEL_DIR))


def masked_text(tokenizer, ids, mask) -> list[str]:
    """The decoded runs of masked tokens, in order."""
    spans, current = [], []
    for token, keep in zip(ids, mask, strict=True):
        if keep:
            current.append(token)
        elif current:
            spans.append(tokenizer.decode(current))
            current = []
    if current:
        spans.append(tokenizer.decode(current))
    return spans


def test_the_loss_mask_covers_exactly_the_assistant_replies(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about tea."},
                {"role": "assistant", "content": "Green tea is bright."}, {"role": "user", "content": "Why?"},
                {"role": "assistant", "content": "Because water."}]
    ids, mask = tokenise_with_mask(tokenizer, messages)
    assert masked_text(tokenizer, ids, mask) == ["Green tea is bright.<|end|>\n", "Because water.<|end|>\n"]
    assert ids == tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)[
        "input_ids"]


def test_trailing_user_turns_are_dropped_and_a_conversation_without_reply_is_refused(tokenizer):
    ids, mask = tokenise_with_mask(tokenizer, [{"role": "user", "content": "Hi"},
                                               {"role": "assistant", "content": "Hello."},
                                               {"role": "user", "content": "unanswered"}])
    assert "unanswered" not in tokenizer.decode(ids)
    assert masked_text(tokenizer, ids, mask) == ["Hello.<|end|>\n"]
    with pytest.raises(ValueError, match="no assistant turn"):
        tokenise_with_mask(tokenizer, [{"role": "user", "content": "Hi"}])


def test_prepared_data_is_what_speculators_prepare_data_writes(prepared):
    import datasets

    folder = prepared / "runs" / "tiny" / "prepared"
    assert {path.name for path in folder.iterdir()} == {"data-00000-of-00001.arrow", "dataset_info.json",
                                                        "state.json", "token_freq.pt"}
    dataset = datasets.load_from_disk(str(folder))
    assert dataset.column_names == ["input_ids", "loss_mask", "seq_len"]
    assert str(dataset.features["input_ids"].feature.dtype) == "int32"  # as datasets types an input_ids column
    assert dataset.format["type"] == "torch"
    assert len(dataset) == 200
    row = dataset[5]
    assert row["input_ids"].shape == row["loss_mask"].shape and int(row["seq_len"]) == row["input_ids"].shape[0]
    assert max(int(n) for n in dataset["seq_len"]) <= 256


def test_token_frequencies_count_loss_masked_tokens_like_speculators(prepared, tmp_path):
    import datasets
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    folder = prepared / "runs" / "tiny" / "prepared"
    theirs = tmp_path / "token_freq.pt"
    save_token_frequency_distribution(datasets.load_from_disk(str(folder)), theirs)
    ours = torch.load(folder / "token_freq.pt", weights_only=True)
    assert ours == torch.load(theirs, weights_only=True)
    assert all(isinstance(key, int) for key in ours)


def test_malformed_records_are_reported_with_line_numbers(prepared):
    report = json.loads((prepared / "runs" / "tiny" / "prepare_report.json").read_text())
    assert [item["line"] for item in report["malformed"]] == [8, 24]
    assert [item["line"] for item in report["skipped"]] == [42]
    assert report["source_lines"][:3] == [1, 2, 3]


def test_strict_makes_malformed_records_fatal(tiny_workdir, tmp_path):
    root = copy_workdir(tiny_workdir, tmp_path / "w")
    code, document, _ = agent(root, "step", "prepare", "--run", "tiny", "--strict")
    assert code == 2
    assert "2 malformed records" in document["error"] and "lines 8, 24" in document["error"]
    assert not (root / "runs" / "tiny" / "prepared").exists()


def test_unchanged_inputs_skip_and_a_changed_config_invalidates_extraction(extracted, tmp_path):
    from specops.pipeline.data import prepare
    from specops.pipeline.run import Manifest

    root = copy_workdir(extracted, tmp_path / "w")
    # the fixture extracted 40 samples: prepare made exactly those 40 rows, and the same 40 are unchanged
    assert prepare(in_workdir(root), 40, strict=False)["status"] == "skipped: unchanged"

    config = root / "runs" / "tiny.yaml"
    config.write_text(config.read_text().replace("max_seq_len: 256", "max_seq_len: 128"))
    run = in_workdir(root)
    report = prepare(run, run.samples_for(None), strict=False)
    assert report["status"] == "done"
    manifest = Manifest(root / "runs" / "tiny")
    assert manifest.record("extract") is None
    assert not (root / "runs" / "tiny" / "hidden_states").exists()
    assert manifest.record("prepare")["inputs"]["max_seq_len"] == 128
    shutil.rmtree(root)
