"""`evaluate --sweep` with the hf backend, on the demo's finished run: one cell per number of speculative
tokens; the cell at the run's own setting counts what the evaluation counted; the document, the plot and
bad values (one line, exit 2)."""

from __future__ import annotations

import json

import pytest

from tests.evaluation.conftest import copy_of
from tests.support.agent import run_agent as agent

CELL_KEYS = {"num_speculative_tokens", "concurrency", "mean_acceptance_length", "acceptance_rate",
             "per_position_acceptance", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "prompts",
             "checkpoint", "backend", "generated_tokens"}


@pytest.mark.slow
def test_an_hf_sweep_scores_each_setting_and_agrees_with_the_evaluation(evaluated, tmp_path) -> None:
    root = copy_of(evaluated, tmp_path / "w")
    evaluation = evaluated[1]["evaluation"]["report"]  # k=3 on the 20 held-out prompts, the best checkpoint
    code, document, stderr = agent(root, "step", "evaluate", "--run", "tiny", "--sweep",
                                   "num_speculative_tokens=1,3", timeout=900)
    assert code == 0, stderr[-3000:]
    sweep = document["sweep"]
    assert document["status"] == "swept" and sweep["backend"] == "hf" and sweep["prompts"] == 20
    assert [(cell["num_speculative_tokens"], cell["concurrency"]) for cell in sweep["cells"]] == [(1, 1), (3, 1)]
    one, three = sweep["cells"]
    assert all(CELL_KEYS <= set(cell) for cell in sweep["cells"])
    assert sweep["checkpoint"] == evaluation["checkpoint"]
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "per_position_acceptance",
                "mean_acceptance_length"):
        assert three[key] == evaluation[key], key
    assert one["num_draft_tokens"] == one["num_drafts"] and len(one["per_position_acceptance"]) == 1
    assert one["generated_tokens"] == three["generated_tokens"]  # the same answers, whatever k
    assert "evaluate: k=1: mean acceptance length" in stderr
    written = json.loads((root / "runs" / "tiny" / "evaluation" / "sweep.json").read_text())
    assert written == sweep
    assert (root / "runs" / "tiny" / "checkpoints" / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("args", "message"), [
    (["--sweep", "num_speculative_tokens=1,x"], "--sweep num_speculative_tokens: expected whole numbers > 0"),
    (["--sweep", "temperature=1,2"], "--sweep: expected num_speculative_tokens=1,2,3"),
    (["--sweep", "num_speculative_tokens=2,2"], "2 appears twice"),
    (["--sweep", "num_speculative_tokens=1", "--concurrency", "1,8", "--backend", "hf"],
     "--concurrency: the hf backend replays the drafting and measures acceptance only"),
    (["--concurrency", "2"], "--concurrency: only with --sweep"),
])
def test_bad_sweep_values_are_one_line_and_exit_2(evaluated, tmp_path, args, message) -> None:
    code, document, _ = agent(evaluated[0], "step", "evaluate", "--run", "tiny", *args)
    assert code == 2 and message in document["error"] and "\n" not in document["error"]


def test_the_sweep_table_has_a_row_per_cell_and_the_speed_columns_with_vllm(capsys) -> None:
    from remote.tasks.pipeline import render_sweep

    cell = {"num_speculative_tokens": 2, "concurrency": 8, "mean_acceptance_length": 1.5, "num_accepted_tokens": 5,
            "num_draft_tokens": 20, "per_position_acceptance": [0.4, 0.1], "tokens_per_s_spec": 30.0,
            "tokens_per_s_base": 20.0, "speedup": 1.5}
    render_sweep({"backend": "vllm", "checkpoint": "3", "prompts": 10, "max_tokens": 16, "cells": [cell],
                  "plot": "/w/runs/tiny/checkpoints/sweep.png"})
    out = capsys.readouterr().out
    assert "speedup" in out and "1.50x" in out and "0.400 / 0.100" in out and "5 / 20" in out
    render_sweep({"backend": "hf", "checkpoint": "3", "prompts": 10, "max_tokens": 16,
                  "cells": [{key: value for key, value in cell.items() if "tokens_per_s" not in key}]})
    assert "speedup" not in capsys.readouterr().out
