"""The step table is the pipeline's one orchestrator: every row has its room's function, imported by the
engine (so import-linter and a reader see the engine -> room arrows), and the summary shows what each
step's report declares, by the names in its row."""

from __future__ import annotations

from pathlib import Path

import pytest

from specops.contract import step_table
from specops.pipeline import engine
from specops.pipeline.run import EffectiveSettings, StepContext


def test_every_row_has_its_rooms_function_and_no_function_lacks_a_row() -> None:
    functions = engine.step_functions()
    assert list(functions) == step_table.names()
    assert all(callable(function) and function.__module__.startswith("specops.pipeline.")
               for function in functions.values())


class _Run:
    class paths:  # the two folders of RunPaths the summary reads
        hidden_states = Path("/nonexistent/hidden_states")
        checkpoints = Path("/nonexistent/checkpoints")


def _context(reports: dict) -> StepContext:
    return StepContext(_Run(), None, EffectiveSettings.fixed("hf"), reports=reports)  # type: ignore[arg-type]


def test_the_summary_shows_each_rows_figures_none_where_the_step_did_not_run() -> None:
    shown = engine.figures(_context({"prepare": {"figures": {"tokens": 10, "loss_tokens": 4}}}))
    assert shown["tokens"] == 10 and shown["loss_tokens"] == 4
    assert {name for row in step_table.STEPS for name in row.figures} <= set(shown)
    assert shown["fidelity"] is None and shown["evaluation"] is None
    assert shown["hidden_state_bytes"] == 0 and shown["checkpoints"] == "/nonexistent/checkpoints"


def test_a_figure_missing_from_its_row_is_the_rooms_mistake_named_at_once() -> None:
    with pytest.raises(RuntimeError, match="step vocab: figures \\['tokens'\\]"):
        engine.figures(_context({"vocab": {"figures": {"tokens": 1}}}))


def test_a_saver_step_runs_where_an_earlier_report_says_the_checkpoint_was_saved() -> None:
    from specops.pipeline.run import OneHost

    evaluate = step_table.step("evaluate")
    hosts = OneHost(rank=1, count=2, names=["a", "b"])
    hf = EffectiveSettings.fixed("hf")
    assert engine.runs_here(evaluate, StepContext(_Run(), None, hf, hosts, {"train": {"saver": 0}})) == "a"
    assert engine.runs_here(evaluate, StepContext(_Run(), None, hf, hosts, {"train": {"saver": 1}})) is None
