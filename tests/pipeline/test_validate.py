"""Validate: whole, matching files and fidelity; damaged or misaligned files are caught."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from specops.pipeline.extraction import file_for
from specops.pipeline.validation import MAX_LISTED, fidelity_indices, validate

from .conftest import copy_workdir, in_workdir


@pytest.fixture
def damaged(extracted, tmp_path):
    """A copy of the extracted workdir and a function that rewrites hs_0 with a change."""
    root = copy_workdir(extracted, tmp_path / "w")
    path = file_for(root / "runs" / "tiny" / "hidden_states", 0)

    def rewrite(change) -> None:
        tensors = load_file(str(path))
        tensors["hidden_states"] = change(tensors["hidden_states"]).contiguous()
        save_file(tensors, str(path))

    return root, path, rewrite


def test_intact_files_pass_with_full_agreement(extracted, tmp_path):
    root = copy_workdir(extracted, tmp_path / "w")
    report = validate(in_workdir(root), 4, run_backend="hf")
    assert report["ok"] is True
    assert report["checks"]["files"]["detail"]["checked"] == 40
    assert report["checks"]["fidelity"]["detail"]["agreement"] == 1.0


def test_a_shifted_file_fails_fidelity(damaged):
    root, _, rewrite = damaged
    rewrite(lambda states: states.roll(1, dims=0))  # every position holds its neighbour's state
    report = validate(in_workdir(root), 1, run_backend="hf")
    assert report["ok"] is False
    assert report["checks"]["files"]["ok"] is True  # shapes and tokens are still right ...
    assert report["checks"]["fidelity"]["detail"]["agreement"] < 0.5  # ... but the states are not theirs


def test_a_shuffled_file_fails_fidelity(damaged):
    root, _, rewrite = damaged
    rewrite(lambda states: states[torch.randperm(states.shape[0], generator=torch.Generator().manual_seed(0))])
    report = validate(in_workdir(root), 1, run_backend="hf")
    assert report["ok"] is False and report["checks"]["fidelity"]["detail"]["agreement"] < 0.5


def test_a_truncated_file_fails_the_file_check(damaged):
    root, path, _ = damaged
    path.write_bytes(path.read_bytes()[:-64])
    report = validate(in_workdir(root), 1, run_backend="hf")
    assert report["ok"] is False
    problems = report["checks"]["files"]["detail"]["problems"]
    assert [p["file"] for p in problems] == ["hs_0.safetensors"] and "bytes" in problems[0]["problem"]


def test_non_finite_values_and_wrong_tokens_are_caught(damaged):
    root, _, rewrite = damaged
    rewrite(lambda states: states.index_fill(0, torch.tensor([3]), float("nan")))
    other = file_for(root / "runs" / "tiny" / "hidden_states", 1)
    tensors = load_file(str(other))
    tensors["token_ids"] = tensors["token_ids"].flip(0).contiguous()
    save_file(tensors, str(other))
    problems = validate(in_workdir(root), 1, run_backend="hf")["checks"]["files"]["detail"]["problems"]
    assert [p["problem"] for p in problems] == ["hidden states hold non-finite values",
                                                "token ids differ from the prepared sample"]


def test_every_bad_file_is_kept_out_of_fidelity_even_beyond_the_listed_problems(extracted, tmp_path):
    root = copy_workdir(extracted, tmp_path / "w")
    folder = root / "runs" / "tiny" / "hidden_states"
    bad_rows = range(MAX_LISTED + 1)  # rows 0..20: one more bad file than the report lists
    for index in bad_rows:
        tensors = load_file(str(file_for(folder, index)))
        tensors["hidden_states"] = tensors["hidden_states"].index_fill(0, torch.tensor([0]), float("nan"))
        save_file(tensors, str(file_for(folder, index)))
    assert fidelity_indices(40, 3) == [0, 20, 39]  # row 20 is the 21st bad file, and a fidelity row
    report = validate(in_workdir(root), 3, run_backend="hf")
    files = report["checks"]["files"]["detail"]
    assert files["bad"] == len(bad_rows) and len(files["problems"]) == MAX_LISTED
    samples = {sample["index"]: sample for sample in report["checks"]["fidelity"]["detail"]["samples"]}
    assert samples[0]["skipped"] == samples[20]["skipped"] == "file failed the file checks"
    assert "skipped" not in samples[39] and samples[39]["agreement"] == 1.0
    assert report["ok"] is False


def test_fidelity_rows_spread_over_the_extracted_rows():
    assert fidelity_indices(40, 4) == [0, 13, 26, 39]
    assert fidelity_indices(3, 10) == [0, 1, 2]
    assert fidelity_indices(40, 1) == [0]
