"""A recorded step's manifest sequence is written once (Manifest.recorded): begin, the step's work, finish;
a step whose work raises is recorded failed, with what it counted, and the error goes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from specops.pipeline.run import Manifest


def test_the_work_done_is_recorded_with_its_counts(tmp_path: Path) -> None:
    manifest = Manifest(tmp_path)
    with manifest.recorded("vocab", "h1", {"draft_vocab": 8}) as outcome:
        outcome.counts = {"draft_vocab": 8}
    record = Manifest(tmp_path).record("vocab")
    assert record is not None and record["status"] == "done" and record["counts"] == {"draft_vocab": 8}
    assert outcome.record["inputs_hash"] == "h1" and Manifest(tmp_path).is_current("vocab", "h1")


def test_a_check_that_failed_is_recorded_with_its_status(tmp_path: Path) -> None:
    with Manifest(tmp_path).recorded("validate", "h1", {}) as outcome:
        outcome.counts, outcome.status = {"files": 3}, "failed"
    assert Manifest(tmp_path).record("validate")["status"] == "failed"


def test_work_that_raises_is_recorded_failed_and_the_error_goes_on(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="disk full"), Manifest(tmp_path).recorded("vocab", "h1", {}) as outcome:
        outcome.counts = {"draft_vocab": 8}
        raise OSError("disk full")
    record = Manifest(tmp_path).record("vocab")
    assert record["status"] == "failed" and record["counts"] == {"draft_vocab": 8}
    assert not Manifest(tmp_path).is_current("vocab", "h1")


def test_no_room_writes_the_sequence_out() -> None:
    """Every recorded step goes through Manifest.recorded: no other module begins or finishes a record."""
    import ast

    root = Path(__file__).resolve().parents[2] / "src" / "specops"
    written_out = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "manifest.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("begin", "_begin", "finish", "_finish")
                    and "manifest" in ast.unparse(node.func.value)):
                written_out.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not written_out, written_out
