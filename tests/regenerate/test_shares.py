"""Regeneration sharded across hosts, through the agent on the tiny model (hf backend, greedy).

Two workdir copies stand for two hosts: each answers its share (`step regenerate --part I/2`), the
shares joined in part order are the one-host answers byte for byte, and `--require-whole` refuses a
merge that lacks a conversation (exit 1, naming it) and records the merged one done with the very
inputs hash a one-host regenerate records, so prepare after it finds regenerate current.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.agent import run_agent as agent

RUN = ("--run", "tiny")
FILES = ("responses.errors.jsonl", "responses.jsonl")


def _folder(root: Path) -> Path:
    return root / "runs" / "tiny" / "regenerated"


@pytest.fixture(scope="module")
def shares(regen_workdir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, dict]]:
    """Two copies of the workdir, copy I after `step regenerate --part I/2`: (root, report) each."""
    made = []
    for index in range(2):
        root = tmp_path_factory.mktemp(f"share{index}") / "w"
        shutil.copytree(regen_workdir, root, symlinks=True)
        code, document, stderr = agent(root, "step", "regenerate", *RUN, "--part", f"{index}/2", timeout=600)
        assert code == 0, f"{document}\n{stderr[-3000:]}"
        made.append((root, document))
    return made


def _merged(shares: list[tuple[Path, dict]], name: str) -> bytes:
    return b"".join(Path(report["share"][name]).read_bytes() for _root, report in shares)


def test_each_share_answers_only_its_contiguous_whole_batches(shares: list[tuple[Path, dict]]) -> None:
    from specops.pipeline.run import Manifest

    (_, one), (_, two) = shares
    assert one["part"]["source"] == two["part"]["source"] == 278
    assert one["part"]["rows"] == [0, 144] and two["part"]["rows"] == [144, 278]  # 18 batches of 16: 9 and 9
    for root, report in shares:
        written = Path(report["share"]["responses"]).read_text().splitlines()
        answered = {json.loads(line)["primary_id"] for line in written}
        source = [json.loads(line)["id"] for line in (_folder(root) / "source.jsonl").read_text().splitlines()]
        start, stop = report["part"]["rows"]
        assert answered <= set(source[start:stop]) and len(answered) + report["counts"]["failed"] == stop - start
        assert not (_folder(root) / "responses.jsonl").exists()  # nothing whole yet
        record = Manifest(root / "runs" / "tiny").record("regenerate")
        assert record["status"] == f"part {report['part']['index']} of 2"
        assert record["inputs_hash"] == report["inputs_hash"]
    assert one["inputs_hash"] == two["inputs_hash"]


def test_the_shares_joined_in_order_are_the_one_host_answers(shares: list[tuple[Path, dict]],
                                                             regenerated: Path) -> None:
    for name, key in zip(FILES, ("errors", "responses"), strict=True):
        assert _merged(shares, key) == (_folder(regenerated) / name).read_bytes(), name


def test_require_whole_refuses_a_missing_conversation_then_records_the_merge_done(
        shares: list[tuple[Path, dict]], regenerated: Path, tmp_path: Path) -> None:
    from specops.pipeline.run import Manifest

    root = tmp_path / "w"
    shutil.copytree(shares[0][0], root, symlinks=True)
    lines = _merged(shares, "responses").decode().splitlines(keepends=True)
    dropped = json.loads(lines[-1])["primary_id"]
    kept = [line for line in lines if json.loads(line)["primary_id"] != dropped]
    (_folder(root) / FILES[0]).write_bytes(_merged(shares, "errors"))
    (_folder(root) / FILES[1]).write_text("".join(kept))
    code, document, stderr = agent(root, "step", "regenerate", *RUN, "--require-whole")
    assert code == 1, stderr[-2000:]
    assert "1 of 278 conversations have no answer" in document["error"] and dropped in document["error"]
    assert Manifest(root / "runs" / "tiny").record("regenerate")["status"] == "part 0 of 2"

    (_folder(root) / FILES[1]).write_bytes(_merged(shares, "responses"))
    code, document, stderr = agent(root, "step", "regenerate", *RUN, "--require-whole")
    assert code == 0, stderr[-2000:]
    alone = Manifest(regenerated / "runs" / "tiny").record("regenerate")
    record = Manifest(root / "runs" / "tiny").record("regenerate")
    assert record["status"] == "done" and record["inputs_hash"] == alone["inputs_hash"]
    assert record["counts"] == alone["counts"]
    code, again, _ = agent(root, "step", "regenerate", *RUN)  # what prepare calls first: current
    assert code == 0 and again["status"] == "skipped: unchanged"


def test_require_whole_on_a_host_that_answered_no_share_refuses(regen_workdir: Path, tmp_path: Path) -> None:
    root = tmp_path / "w"
    shutil.copytree(regen_workdir, root, symlinks=True)
    code, document, _ = agent(root, "step", "regenerate", *RUN, "--require-whole")
    assert code == 1 and "answered no share of these inputs" in document["error"]


@pytest.mark.parametrize(("flags", "expected"), [
    (("--part", "2/2"), "expected I/COUNT with 0 <= I < COUNT, got '2/2'"),
    (("--part", "0/2", "--require-whole"), "--part and --require-whole exclude each other"),
])
def test_bad_share_flags_are_one_error_line_and_exit_2(regen_workdir: Path, tmp_path: Path, flags: tuple,
                                                 expected: str) -> None:
    root = tmp_path / "w"
    shutil.copytree(regen_workdir, root, symlinks=True)
    code, document, stderr = agent(root, "step", "regenerate", *RUN, *flags)
    assert code == 2 and expected in document["error"] and "\n" not in document["error"], stderr
    assert not _folder(root).exists()


def test_shares_are_whole_batches_in_source_order_and_a_host_past_the_last_batch_gets_none() -> None:
    from specops.pipeline.regenerate.shares import share_span

    assert [share_span(278, 16, (index, 2)) for index in range(2)] == [(0, 144), (144, 278)]
    assert [share_span(278, 16, (index, 3)) for index in range(3)] == [(0, 96), (96, 192), (192, 278)]
    assert [share_span(20, 16, (index, 3)) for index in range(3)] == [(0, 16), (16, 20), (20, 20)]
