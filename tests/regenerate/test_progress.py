"""What a user waits on while the target answers, shown: the vllm backend's watch of speculators' outfile.

speculators' `regenerate-responses` appends a conversation's rows to its outfile when the conversation is done
and a failed conversation to its errors file. A writer here appends exactly that, as the client does (a line
may arrive in two writes), while the watch runs: each line says conversations done of those asked, answers,
answers a second and an ETA, and progress.json holds the same figures for `invoke status`. The hf backend's
lines are asserted on its real run (test_regenerate_hf.py).
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from specops.pipeline.regenerate.progress import Answering, OutfileWatcher, answered_before

LINE = re.compile(r"^regenerate: (\d+)/(\d+) conversations, (\d+) answers(?:, (\d+) failed)?, ([\d.]+) answers/s, "
                  r"ETA (\?|\d+s)")


def _row(conversation: str, turn: int) -> str:
    return json.dumps({"id": f"{conversation}_gen{turn}", "primary_id": conversation, "input_ids": [1, 2, 3],
                       "loss_mask": [0, 1, 1], "metadata": {"usage": {"completion_tokens": 2}}}) + "\n"


def test_the_outfile_watch_counts_what_the_client_appends_as_it_goes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    responses, errors = tmp_path / "responses.jsonl", tmp_path / "responses.errors.jsonl"
    responses.write_text(_row("done-before", 0))  # answered by an earlier client run: --resume skips it
    assert answered_before(responses) == {"done-before"}
    progress = Answering(tmp_path / "progress.json", total=4, every_s=0.0)
    seen_while_running: list[dict] = []

    def shown_done(count: int) -> dict:
        deadline = time.monotonic() + 60  # a loaded machine: the watch looks every 0.05 s
        while (document := json.loads((tmp_path / "progress.json").read_text()))["done"] < count:
            assert time.monotonic() < deadline, document
            time.sleep(0.02)
        return document

    def client() -> None:
        with responses.open("a") as out, errors.open("a") as err:
            for done, (conversation, turns) in enumerate((("a", 2), ("b", 1)), 1):  # a two-turn conversation: 2 rows
                for turn in range(turns):
                    out.write(_row(conversation, turn))
                out.flush()
                seen_while_running.append(shown_done(done))
            cut = _row("c", 0)
            out.write(cut[:20])  # half a line: not counted until its end comes
            out.flush()
            time.sleep(0.3)
            out.write(cut[20:])
            out.flush()
            err.write(json.dumps({"id": "d", "metadata": {"error": "ValueError('empty')"}}) + "\n")

    with OutfileWatcher(progress, responses, errors, every_s=0.05):
        writer = threading.Thread(target=client)
        writer.start()
        writer.join()
    progress.finish()

    # shown while the client ran: conversation by conversation, with its answers
    assert [(document["done"], document["answers"]) for document in seen_while_running] == [(1, 2), (2, 3)]
    assert (progress.done, progress.answers, progress.failed, progress.tokens) == (4, 4, 1, 8)
    shown = [LINE.match(line) for line in capsys.readouterr().err.splitlines()]
    assert all(shown) and shown[0].group(1, 2, 3, 6) == ("0", "4", "0", "?")  # nothing done: no ETA yet
    assert shown[-1].group(1, 2, 3, 4, 6) == ("4", "4", "4", "1", "0s")
    saved = json.loads((tmp_path / "progress.json").read_text())
    assert saved["state"] == "done" and saved["done"] == saved["total"] == 4 and saved["answers"] == 4
    assert saved["answers_per_s"] > 0 and saved["eta_s"] == 0


def test_a_long_piece_of_work_is_shown_where_it_is_at_the_usual_pace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    progress = Answering(tmp_path / "progress.json", total=32, every_s=3600.0)
    progress.start()
    for tokens in range(1, 100):  # a batch's generation steps: no line until the pace allows one
        progress.within(f"batch 1/1, turn 1 of 32 conversations: {tokens} of at most 128 tokens")
    progress.add(32, 30, failed=2, force=True)  # the batch's end is news
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[1].startswith("regenerate: 32/32 conversations, 30 answers, 2 failed, ")
    progress.every_s = 0.0
    progress.within("batch 2/2, turn 1 of 32 conversations: 7 of at most 128 tokens")
    assert capsys.readouterr().err.rstrip().endswith("(batch 2/2, turn 1 of 32 conversations: 7 of at most 128 "
                                                     "tokens)")


def test_invoke_status_shows_the_answering_while_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from remote.tasks.jobs import jobs_summary
    from specops.jobs.liveness import step_progress

    monkeypatch.setenv("SPECOPS_WORKDIR", str(tmp_path))
    folder = tmp_path / "runs" / "tiny" / "regenerated"
    folder.mkdir(parents=True)
    progress = Answering(folder / "progress.json", total=10, every_s=0.0)
    progress.start()
    progress.add(4, 5)
    job = {"id": "pipeline-tiny-1", "name": "pipeline", "run": "tiny", "state": "running"}
    shown = step_progress(job)
    assert shown is not None and (shown["done"], shown["total"], shown["answers"]) == (4, 10, 5)
    assert jobs_summary({"jobs": [{**job, "progress": shown}]}).startswith(f"1 running; pipeline-tiny-1 running 4/10, "
                                                                           f"ETA {shown['eta_s']} s")
    progress.finish()
    assert step_progress(job) is None  # done: the job is elsewhere now
