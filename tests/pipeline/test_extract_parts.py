"""One host's share of an extraction spread over several hosts (`step extract --part I/COUNT`), and
the check that every file is whole before anything trains (`step extract --require-whole`).

Each share is a contiguous run of whole batches of the one-host plan, so two hosts' shares put
together are the same bytes as one host's files; the check writes nothing, records the step done
when all N files are whole, and refuses (exit 1, naming the file) when one is not.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.agent import run_agent as agent

from .conftest import copy_workdir
from .test_extract import hidden_state_files

SAMPLES = "12"
BATCH_TOKENS = "256"  # the longest tiny row: several batches to share out


def extract(root: Path, *extra: str) -> tuple[int, dict, str]:
    return agent(root, "step", "extract", "--run", "tiny", "--samples", SAMPLES, "--batch-tokens", BATCH_TOKENS,
                 *extra)


def folder(root: Path) -> Path:
    return root / "runs" / "tiny" / "hidden_states"


@pytest.mark.slow  # long: scheduled among the first (tests/support/workers.py)
def test_two_shares_gathered_are_the_bytes_of_one_host_and_the_check_records_the_step(
        prepared: Path, tmp_path: Path) -> None:
    one, first, second = (copy_workdir(prepared, tmp_path / name) for name in ("one", "first", "second"))
    code, _single, stderr = extract(one)
    assert code == 0, stderr
    shares = {}
    for index, root in enumerate((first, second)):
        code, document, stderr = extract(root, "--part", f"{index}/2")
        assert code == 0, stderr
        assert document["status"] == f"part {index} of 2"
        part = document["part"]
        assert part["others_whole"] is False and part["samples"] == int(SAMPLES)
        rows = [row for start, stop in part["spans"] for row in range(start, stop)]
        assert document["counts"]["written"] == part["rows"] == len(rows) > 0
        assert sorted(path.name for path in folder(root).glob("hs_*.safetensors")) == sorted(
            f"hs_{row}.safetensors" for row in rows)  # only its own rows
        shares[index] = rows
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(int(SAMPLES)))
    # a share is not the whole step: the check refuses while rows are missing
    code, refused, _ = extract(first, "--require-whole")
    assert code == 1 and "missing" in refused["error"] and "hs_" in refused["error"]

    for row in shares[1]:  # gather: the second host's files onto the first
        shutil.copy2(folder(second) / f"hs_{row}.safetensors", folder(first) / f"hs_{row}.safetensors")
    code, checked, stderr = extract(first, "--require-whole")
    assert code == 0, stderr
    assert checked["status"] == "done" and checked["counts"]["written"] == 0
    assert hidden_state_files(first) == hidden_state_files(one)  # byte for byte
    code, again, _ = extract(first, "--part", "0/2")
    assert code == 0 and again["status"] == "skipped: unchanged" and again["part"]["others_whole"] is True


def test_the_check_names_a_truncated_file_and_writes_nothing(prepared: Path, tmp_path: Path) -> None:
    root = copy_workdir(prepared, tmp_path / "w")
    code, _document, stderr = extract(root)
    assert code == 0, stderr
    victim = folder(root) / "hs_3.safetensors"
    victim.write_bytes(victim.read_bytes()[:-100])
    before = hidden_state_files(root)
    code, refused, _ = extract(root, "--require-whole")
    assert code == 1
    assert str(victim) in refused["error"] and "header promises" in refused["error"]
    assert hidden_state_files(root) == before  # not regenerated, not removed


def test_a_part_and_the_check_are_bad_input_together_or_malformed(prepared: Path, tmp_path: Path) -> None:
    root = copy_workdir(prepared, tmp_path / "w")
    code, document, _ = extract(root, "--part", "2/2")
    assert code == 2 and "I/COUNT" in document["error"]
    code, document, _ = extract(root, "--part", "0/2", "--require-whole")
    assert code == 2 and "exclude each other" in document["error"]
    assert not folder(root).exists()
