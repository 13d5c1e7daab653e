"""Step 3: the draft vocabulary speculators reads (d2t int64, t2d bool) and its coverage report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from specops.contract.errors import BadInput
from specops.pipeline.training.vocab import build_mapping, build_vocab, coverage

# token id -> count: 10 and 11 tie (smaller id first), 3 is seen once, most ids never.
FREQ = {7: 50, 10: 20, 11: 20, 2: 9, 3: 1}


def test_draft_vocabulary_is_the_most_frequent_tokens_in_target_order() -> None:
    d2t, t2d = build_mapping(FREQ, draft_vocab=3, target_vocab=16)
    assert d2t.dtype == np.int64 and d2t.shape == (3,)
    assert t2d.dtype == np.bool_ and t2d.shape == (16,)
    assert list(np.arange(3) + d2t) == [7, 10, 11]  # 11 beats 2 (more frequent), 10 beats 11 only on id
    assert list(np.flatnonzero(t2d)) == [7, 10, 11]


def test_unseen_tokens_fill_the_draft_vocabulary_from_the_smallest_ids() -> None:
    d2t, t2d = build_mapping(FREQ, draft_vocab=8, target_vocab=16)
    targets = list(np.arange(8) + d2t)
    assert targets == [0, 1, 2, 3, 4, 7, 10, 11]
    assert t2d.sum() == 8 and all(t2d[targets])


def test_mapping_equals_the_one_speculators_builds_itself() -> None:
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    rng = np.random.default_rng(3)
    freq = {int(token): int(count) for token, count in zip(rng.integers(0, 500, 300), rng.integers(1, 40, 300),
                                                           strict=True)}
    for draft_vocab in (16, 128, 400):
        ours = build_mapping(freq, draft_vocab, 512)
        theirs = build_vocab_mappings_from_distribution(freq, draft_vocab, 512)
        assert np.array_equal(ours[0], theirs[0].numpy())
        assert np.array_equal(ours[1], theirs[1].numpy())


def test_coverage_is_the_share_of_assistant_token_occurrences() -> None:
    rows = coverage(FREQ, [1, 2, 4, 99], target_vocab=16)
    assert [(row["draft_vocab"], row["covered"], row["total"]) for row in rows] == [
        (1, 50, 100), (2, 70, 100), (4, 99, 100), (16, 100, 100)]  # 99 is clipped to the target vocab
    assert rows[1]["share"] == pytest.approx(0.70)


def test_bad_sizes_and_ids_are_bad_input() -> None:
    with pytest.raises(BadInput, match="between 1 and the target vocab"):
        build_mapping(FREQ, draft_vocab=17, target_vocab=16)
    with pytest.raises(BadInput, match="outside the target vocabulary"):
        build_mapping({20: 1}, draft_vocab=2, target_vocab=16)


def test_build_writes_numpy_files_and_skips_when_unchanged(tmp_path: Path) -> None:
    token_freq = tmp_path / "token_freq.pt"
    torch.save(FREQ, token_freq)
    first = build_vocab(token_freq, 4, 16, tmp_path / "vocab")
    assert first["skipped"] is False
    d2t, t2d = np.load(first["d2t"]), np.load(first["t2d"])
    assert d2t.dtype == np.int64 and list(np.arange(4) + d2t) == [2, 7, 10, 11]
    assert t2d.dtype == np.bool_ and t2d.sum() == 4
    report = json.loads((tmp_path / "vocab" / "vocab.json").read_text())
    assert [row["draft_vocab"] for row in report["coverage"]] == [4, 16]  # 8k..64k clip to 16

    assert build_vocab(token_freq, 4, 16, tmp_path / "vocab")["skipped"] is True
    torch.save({**FREQ, 5: 1000}, token_freq)
    again = build_vocab(token_freq, 4, 16, tmp_path / "vocab")
    assert again["skipped"] is False
    assert 5 in list(np.arange(4) + np.load(again["d2t"]))
