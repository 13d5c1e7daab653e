"""What a person sees of a pipeline is specops' own lines and progress; the libraries' lines stay in the log.

The demo's whole pipeline (the `finished` fixture) printed its steps' lines among speculators' loguru
records, Hugging Face loading bars and Python warnings, as a job's log holds them. Through the view
that `invoke pipeline` and every step task show (remote.step_view), every line left is one of specops';
a failed step still shows the libraries' last lines. Tables never show an empty header row.
"""

from __future__ import annotations

import io
import re

from tests.support.finished import pipeline_log

# specops' own lines: a step's or specops' prefix, the trainer's epoch bars (drawn by the view), and the
# few lines the prepare and vocab steps print without one.
SPECOPS_LINE = re.compile(r"^(?:(?:specops|regenerate|prepare|extract|validate|parity|vocab|train|evaluate|vllm): "
                          r"|epoch \d+/\d+ |draft vocab +\d+: |prepared \d+ rows |[\w.-]+\.jsonl: \d+ malformed )")


def view_of(log: str, failed: bool = False) -> str:
    from remote.step_view import StepView

    shown = io.StringIO()
    view = StepView(shown)
    view.feed(log)
    view.close(failed=failed)
    return shown.getvalue()


def test_the_pipeline_view_holds_specops_lines_only_and_the_log_keeps_the_rest(evaluated) -> None:
    log = pipeline_log(evaluated)
    # the log holds what the libraries printed: what the view has to leave out
    assert "| INFO     | speculators" in log and "Loading from local directory" in log
    assert "Loading weights:" in log
    shown = [line for line in view_of(log).splitlines() if line.strip()]
    assert [line for line in shown if not SPECOPS_LINE.match(line)] == []
    for expected in ("specops: == evaluate", "evaluate: untrained: mean acceptance length",
                     "validate: fidelity on rows", "specops: train: done in"):
        assert any(line.startswith(expected) for line in shown), expected
    assert any(line.startswith("epoch 4/4 ") for line in shown)  # the trainer as bars


def test_a_failed_step_still_shows_the_libraries_last_lines() -> None:
    log = ("specops: == evaluate\n"
           "2026-12-03 17:13:19.897 | INFO     | speculators.utils.loading:_resolve_file:163 - Loading from x\n"
           "/venv/site-packages/torch/utils/data.py:759: UserWarning: 'pin_memory' is set\n"
           "  warnings.warn(warn_msg)\n"
           "\rLoading weights:   0%|          | 0/17 [00:00<?, ?it/s]\rLoading weights: 100%|###| 17/17 [00:00<00:00]\n"
           "(APIServer pid=7) INFO 12-03 17:14:29 [api_server.py:1] Starting vLLM API server\n"
           "vllm: (EngineCore_DP0 pid=9) WARNING 12-03 17:14:30 [cpu.py:2] Pin memory is not supported\n"
           "2026-12-03 17:13:21.000 | ERROR    | speculators.train:run:1 - the trainer failed\n")
    assert view_of(log).splitlines() == [
        "specops: == evaluate", "2026-12-03 17:13:21.000 | ERROR    | speculators.train:run:1 - the trainer failed"]
    failed = view_of(log, failed=True)
    assert "the libraries' last log lines (all of them are in the job's log):" in failed
    assert "Starting vLLM API server" in failed and "Loading from x" in failed


def test_a_label_and_value_table_has_no_header_row(capsys) -> None:
    from remote.tasks.pipeline import render_summary

    render_summary({"run": "tiny", "host": "local", "hosts": ["local"], "samples": 200, "elapsed_s": 1.0,
                    "steps": {"train": {"status": "done", "seconds": 1.0}}})
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines[0].startswith("pipeline — run tiny on local")
    # the title, the top border, then the first row: no header row and no rule under one
    assert "steps" in lines[2] and "samples" in lines[3] and not any(set(line) <= set("┡━┩╇ ") for line in lines)
