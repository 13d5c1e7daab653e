"""What regenerate wrote, checked: failures are counted and listed, a cut line or a half-written
conversation (what a kill -9 of speculators' client leaves) is removed before resuming."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from specops.pipeline.regenerate.output import ERRORS_FILE, RESPONSES_FILE, check, tidy


def _copy(regenerated: Path, tmp_path: Path) -> tuple[Path, list[dict]]:
    folder = tmp_path / "regenerated"
    shutil.copytree(regenerated / "runs" / "tiny" / "regenerated", folder)
    source = [json.loads(line) for line in (folder / "source.jsonl").read_text().splitlines()]
    return folder, source


def test_failed_conversations_are_counted_and_listed(regenerated: Path, tmp_path: Path) -> None:
    folder, source = _copy(regenerated, tmp_path)
    before = check(folder, source)
    rows = (folder / RESPONSES_FILE).read_text().splitlines()
    failed = json.loads(rows[3])["primary_id"]
    (folder / RESPONSES_FILE).write_text("".join(line + "\n" for line in rows if failed not in line))
    # the errors file exactly as speculators' worker writes a failed conversation
    error = {"id": failed, "metadata": {"idx": 3, "error": "ValueError('empty assistant generation (sample 0)')",
                                        "generations_completed": 0, "endpoint": "http://127.0.0.1:8000/v1"}}
    with (folder / ERRORS_FILE).open("a") as handle:
        handle.write(json.dumps(error) + "\n")
    checked = check(folder, source)
    assert checked["failed"] == before["failed"] + 1
    assert {"id": failed, "error": error["metadata"]["error"]} in checked["failed_list"]
    assert checked["conversations"] == before["conversations"] - 1
    assert checked["conversations"] + checked["failed"] == len(source)
    assert checked["missing"] == 0 and checked["problems"] == []


def test_rows_written_twice_are_a_problem(regenerated: Path, tmp_path: Path) -> None:
    folder, source = _copy(regenerated, tmp_path)
    first = (folder / RESPONSES_FILE).read_text().splitlines()[0]
    with (folder / RESPONSES_FILE).open("a") as handle:
        handle.write(first + "\n")
    assert check(folder, source)["problems"] == ["1 rows written twice (e.g. " + json.loads(first)["id"] + ")"]


def test_tidy_removes_a_cut_line_and_a_half_written_conversation(regenerated: Path, tmp_path: Path) -> None:
    folder, _source = _copy(regenerated, tmp_path)
    whole = (folder / RESPONSES_FILE).read_text()
    lines = whole.splitlines()
    two_turns = json.loads(lines[0])
    second = {**two_turns, "id": two_turns["primary_id"] + "_gen1", "input_ids": [1, 2], "loss_mask": [0, 1]}
    broken = whole + json.dumps(second) + "\n" + lines[1][: len(lines[1]) // 2]  # gen1 of a 3-turn chat, then a cut
    (folder / RESPONSES_FILE).write_text(broken)
    expected = {two_turns["primary_id"]: 3}  # three user turns: gen2 never came
    assert tidy(folder, expected, max_tokens=10_000) == {"cut_lines": 1, "partial_rows": 2}
    kept = (folder / RESPONSES_FILE).read_text()
    assert kept == "".join(line + "\n" for line in lines[1:])
    assert tidy(folder, expected, max_tokens=10_000) == {"cut_lines": 0, "partial_rows": 0}


def test_answers_holding_unicode_line_separators_stay_one_row(regenerated: Path, tmp_path: Path) -> None:
    """A random target answers with any bytes: U+2028, U+0085 or U+001E inside a JSON string written
    with ensure_ascii=False is no line break (str.splitlines would split there)."""
    folder, source = _copy(regenerated, tmp_path)
    before = check(folder, source)
    rows = [json.loads(line) for line in (folder / RESPONSES_FILE).read_text().split("\n") if line]
    text_key = next(key for key, value in rows[0].items() if isinstance(value, str) and key not in ("id", "primary_id"))
    rows[0][text_key] += " \u2028 \x85 \x1e \u2029"
    (folder / RESPONSES_FILE).write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    checked = check(folder, source)
    assert checked["problems"] == [] and checked["conversations"] == before["conversations"]


def test_many_failures_read_as_one_line_a_reason_most_frequent_first(tmp_path: Path) -> None:
    from specops.pipeline.regenerate.output import FAILURES_EACH, failure_lines

    errors_file = tmp_path / ERRORS_FILE
    too_long = [{"id": f"c{n:03d}", "error": f"InvalidResponseError('HTTP 400: maximum context length is 1025 tokens; "
                 f"your prompt contains at least {900 + n} input tokens')"} for n in range(40)]
    empty = [{"id": "e001", "error": "ValueError('empty assistant generation (sample 0)')"},
             {"id": "e002", "error": "ValueError('empty assistant generation (sample 0)')"}]
    lines = failure_lines(empty + too_long, errors_file)
    assert lines[0] == f"regenerate: 42 conversations failed, for 2 reason(s); each with its error in {errors_file}"
    assert lines[1].startswith("regenerate:   40 x InvalidResponseError('HTTP 400: maximum context length is 1025 ")
    assert "at least 900 input tokens" in lines[1] and lines[1].endswith("(c000, c001, c002, ...)")
    assert lines[2] == "regenerate:   2 x ValueError('empty assistant generation (sample 0)') (e001, e002)"
    assert len(lines) == 3
    # a few: each its own line, as before
    few = failure_lines(too_long[:FAILURES_EACH], errors_file)
    assert few == [f"regenerate: conversation {f['id']} failed: {f['error']}" for f in too_long[:FAILURES_EACH]]


def test_a_long_reason_is_cut_in_the_log_and_whole_in_the_errors_file(tmp_path: Path) -> None:
    from specops.pipeline.regenerate.output import REASON_CHARS, failure_lines

    reason = "RuntimeError('" + "x" * 1000 + "')"
    lines = failure_lines([{"id": f"c{n}", "error": reason} for n in range(9)], tmp_path / ERRORS_FILE)
    assert lines[1] == f"regenerate:   9 x {reason[:REASON_CHARS]}... (c0, c1, c2, ...)"
