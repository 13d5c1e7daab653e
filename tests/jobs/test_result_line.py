"""What `invoke status` shows of a job (issue 46): an ended job's own result (a failure's reason), never the
trainer's internal `### specops` markers, and a long line cut at a word with an ellipsis."""

from __future__ import annotations

import json
from pathlib import Path

from remote.tasks.jobs import clip
from specops.jobs.logtail import last_line, result_line


def test_an_ended_jobs_result_is_its_own_document(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("prepared 10 rows\nuntrained draft: acceptance 1.01\n"
                   + json.dumps({"ok": True, "step": "extract", "status": "skipped: unchanged"}) + "\n")
    assert result_line(log) == "extract: skipped: unchanged"
    log.write_text("a traceback line\n" + json.dumps({"ok": False, "error": "--checkpoint: epoch 99 has none"}) + "\n")
    assert result_line(log) == "--checkpoint: epoch 99 has none"
    log.write_text(json.dumps({"run": "tiny", "steps": {"prepare": {"status": "skipped: unchanged"},
                                                          "train": {"status": "done"}}}) + "\n")
    assert result_line(log) == "pipeline: 1 skipped, 1 done"
    log.write_text("no document\n")
    assert result_line(log) is None


def test_internal_markers_are_never_the_last_line(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text('epoch 1 done\n### specops trainer start {"epochs": 3}\n')
    assert last_line(log) == "epoch 1 done"


def test_a_long_line_is_cut_at_a_word_with_an_ellipsis() -> None:
    text = "prepared 10 rows (data lines 1..10), 2345 tokens into the prepared folder of the run tiny on this host"
    cut = clip(text, 60)
    assert cut.endswith("…") and len(cut) <= 60 and text.startswith(cut[:-1]) and cut[-2] != " "
    assert text.startswith(cut[:-1]) and text[len(cut) - 1] in " ,"
    assert clip("short line") == "short line"
