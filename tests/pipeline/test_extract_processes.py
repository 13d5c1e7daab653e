"""The hf backend in several processes (one per GPU on a GPU host): each process runs whole batches of
the one-process plan, so the files are the same bytes as one process's, and the step's record is one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specops.pipeline.extraction.hf_shards import split_batches
from tests.support.agent import run_agent as agent

from .conftest import copy_workdir
from .test_extract import hidden_state_files

SAMPLES = "24"
BATCH_TOKENS = "256"  # the longest tiny row: many small batches to share out


def test_split_batches_gives_each_process_a_contiguous_run_of_whole_batches() -> None:
    batches = [[3, 1], [0], [2, 5], [4]]
    assert split_batches(batches, 2) == [[[3, 1], [0]], [[2, 5], [4]]]
    assert split_batches(batches, 3) == [[[3, 1], [0]], [[2, 5]], [[4]]]
    assert split_batches(batches[:1], 2) == [[[3, 1]], []]


@pytest.mark.slow  # long: scheduled among the first (tests/support/workers.py)
def test_two_processes_write_the_same_files_as_one(prepared: Path, tmp_path: Path) -> None:
    one = copy_workdir(prepared, tmp_path / "one")
    two = copy_workdir(prepared, tmp_path / "two")
    code, single, _ = agent(one, "step", "extract", "--run", "tiny", "--samples", SAMPLES,
                            "--batch-tokens", BATCH_TOKENS, "--processes", "1")
    assert code == 0 and single["processes"] == 1
    code, shared, stderr = agent(two, "step", "extract", "--run", "tiny", "--samples", SAMPLES,
                                 "--batch-tokens", BATCH_TOKENS, "--processes", "2")
    assert code == 0, stderr
    assert shared["processes"] == 2 and shared["counts"]["written"] == int(SAMPLES)
    files_one, files_two = hidden_state_files(one), hidden_state_files(two)
    assert len(files_one) == int(SAMPLES)
    assert files_two == files_one  # byte for byte
    plan = json.loads((two / "runs" / "tiny" / "extract-shards.json").read_text())
    rows = [[row for batch in shard for row in batch] for shard in plan["shards"]]
    assert len(rows) == 2 and all(rows) and not set(rows[0]) & set(rows[1])  # disjoint, both did work
    progress = json.loads((two / "runs" / "tiny" / "hidden_states" / "progress.json").read_text())
    assert (progress["state"], progress["done"], progress["total"]) == ("done", int(SAMPLES), int(SAMPLES))
    # the same inputs: a second run is skipped, whatever the process count
    code, again, _ = agent(two, "step", "extract", "--run", "tiny", "--samples", SAMPLES,
                           "--batch-tokens", BATCH_TOKENS)
    assert code == 0 and again["status"] == "skipped: unchanged"


def test_processes_are_the_hf_backends_choice_only(prepared: Path, tmp_path: Path) -> None:
    root = copy_workdir(prepared, tmp_path / "w")
    code, document, _ = agent(root, "step", "extract", "--run", "tiny", "--backend", "vllm", "--processes", "2")
    assert code == 2
    assert "--processes: only for the hf backend" in document["error"]
