"""`train --sweep`: several drafts from one extraction, on a copy of the demo's finished run. A setting equal to the
run's own config is the run itself (not trained again); another trains into its own checkpoints folder from the
run's prepared rows, hidden states and vocabulary, is scored by the run's evaluation, and the best is named with its
margin; the run's own records stay as they were, and the same sweep again trains nothing. Bad input is one line,
exit 2, before any training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.agent import run_agent as agent
from tests.support.finished import copy_of


def _manifest(root):
    return json.loads((root / "runs" / "tiny" / "manifest.json").read_text())


@pytest.mark.slow
def test_a_sweep_trains_each_setting_from_the_same_extraction_and_names_the_best(finished, tmp_path) -> None:
    root = copy_of(finished, tmp_path / "w")
    before = _manifest(root)["steps"]
    run_dir = root / "runs" / "tiny"
    hidden = sorted((path.name, path.stat().st_mtime_ns) for path in (run_dir / "hidden_states").iterdir())
    code, document, stderr = agent(root, "step", "train", "--run", "tiny", "--sweep", "train.epochs=4,1",
                                   timeout=1200)
    assert code == 0, stderr[-3000:]
    sweep = document["sweep"]
    own, one = sweep["rows"]
    assert (own["label"], own["own"], own["train"], own["evaluate"]) == ("train.epochs=4", True,
                                                                         "skipped: unchanged", "skipped: unchanged")
    assert own["checkpoints"] == str(run_dir / "checkpoints")
    assert own["sets"]["heldout"]["mean_acceptance_length"] == finished[1]["evaluation"]["report"][
        "mean_acceptance_length"]
    assert (one["label"], one["own"], one["train"], one["evaluate"], one["epochs"]) == (
        "train.epochs=1", False, "done", "done", 1)
    setting = run_dir / "sweeps" / "train.epochs-1"
    assert one["checkpoints"] == str(setting / "checkpoints") and (setting / "checkpoints" / "0").is_dir()
    assert (setting / "evaluation" / "report.json").is_file() and not (setting / "vocab").exists()  # the run's
    assert one["sets"]["heldout"]["prompts"] == own["sets"]["heldout"]["prompts"] == 20
    best = sweep["best"]
    lengths = {row["label"]: row["sets"]["heldout"]["mean_acceptance_length"] for row in sweep["rows"]}
    winner, runner = sorted(lengths, key=lambda label: -lengths[label])
    assert (best["label"], best["runner_up"]) == (winner, runner)
    assert best["margin"] == pytest.approx(lengths[winner] - lengths[runner], abs=1e-4)
    assert best["per_set"]["heldout"]["label"] == winner and sweep["sets"] == ["heldout"]
    assert json.loads((run_dir / "sweeps" / "sweep.json").read_text()) == sweep
    # nothing of the run's own was made again: its records, its hidden states
    assert _manifest(root)["steps"] == before
    assert sorted((path.name, path.stat().st_mtime_ns) for path in (run_dir / "hidden_states").iterdir()) == hidden
    assert "regenerate" not in stderr.lower().replace("regenerated", "")
    # the same sweep again (a sweep stopped and run again): every finished setting skips
    code, again, stderr = agent(root, "step", "train", "--run", "tiny", "--sweep", "train.epochs=1,4", timeout=600)
    assert code == 0, stderr[-3000:]
    assert [(row["label"], row["train"], row["evaluate"]) for row in again["sweep"]["rows"]] == [
        ("train.epochs=1", "skipped: unchanged", "skipped: unchanged"),
        ("train.epochs=4", "skipped: unchanged", "skipped: unchanged")]


@pytest.fixture(scope="module")
def refused_in(finished, tmp_path_factory) -> Path:
    """One copy of the finished run for every refusal below: `step train` holds the run while it reads the sweep,
    so refusals in the shared finished workdir itself, one in each worker, would find the run busy."""
    return copy_of(finished, tmp_path_factory.mktemp("refused") / "w")


@pytest.mark.parametrize(("sweep", "message"), [
    (["train.lr=abc"], "--sweep train.lr=abc: train.lr: must be a valid number"),
    (["draft.method=nonsense"], "--sweep draft.method=nonsense: draft.method: must be 'eagle3'"),
    (["train.lr=1e-3,0.001"], "--sweep: train.lr=1e-3 and train.lr=0.001 are the same setting"),
    (["data=other.jsonl"], "--sweep data: changes what the regenerate step made; a sweep never regenerates"),
    (["layer_ids=[1,2,3,4]"], "--sweep layer_ids: changes what the extract step made"),
    (["max_seq_len=128,512"], "--sweep max_seq_len: changes what the prepare step made"),
    (["hidden_states.backend=fp8"], "--sweep hidden_states.backend: changes what the extract step made"),
    (["evaluate.num_speculative_tokens=1,2"], "invoke evaluate --sweep num_speculative_tokens="),
    (["vllm.port=8001"], "--sweep vllm.port: not a setting a training sweep varies"),
    (["train.speed=1"], "--sweep train.speed: not a setting of runs/tiny.yaml (train has no key 'speed')"),
    (["train.stop_if=1"], "--sweep train.stop_if: a mapping"),
    (["train=1"], "--sweep train: name one key of train"),
    (["train.lr="], "--sweep train.lr: no values (an empty sweep trains nothing)"),
])
def test_a_sweep_it_cannot_train_is_one_line_exit_2_before_anything(refused_in, sweep, message) -> None:
    root = refused_in
    args = [item for value in sweep for item in ("--sweep", value)]
    code, document, _ = agent(root, "step", "train", "--run", "tiny", *args)
    assert code == 2 and message in document["error"] and "\n" not in document["error"], document
    assert not (root / "runs" / "tiny" / "sweeps").exists()


def test_the_sweep_table_names_the_best_per_set_and_its_margin(capsys) -> None:
    from remote.tasks.pipeline import render_train_sweep

    def row(label, heldout, mtbench, own=False):
        return {"label": label, "values": {"train.lr": float(label.split("=")[1])}, "own": own, "status": "done",
                "epochs": 3, "loss_last": 1.25,
                "sets": {"heldout": {"mean_acceptance_length": heldout, "per_position_acceptance": [0.5, 0.25],
                                     "untrained": 1.0},
                         "mtbench": {"mean_acceptance_length": mtbench, "per_position_acceptance": [0.4, 0.2],
                                     "untrained": 1.0}}}

    from specops.pipeline.train_sweep import best_of

    rows = [row("train.lr=0.001", 1.5, 1.5, own=True), row("train.lr=0.003", 1.6, 1.3),
            {"label": "train.lr=0.01", "own": False, "status": "failed", "error": "stopped: acceptance 1.0"}]
    best = best_of(rows, ["heldout", "mtbench"])
    assert (best["label"], best["runner_up"], best["margin"]) == ("train.lr=0.001", "train.lr=0.003", 0.05)
    assert best["values"] == {"train.lr": 0.001} and best["by"].endswith("on heldout, mtbench")
    assert best["per_set"]["heldout"]["label"] == "train.lr=0.003" and best["per_set"]["heldout"]["margin"] == 0.1
    assert best["per_set"]["mtbench"]["label"] == "train.lr=0.001"
    render_train_sweep({"run": "tiny", "rows": rows, "sets": ["heldout", "mtbench"], "best": best})
    out = capsys.readouterr().out
    assert "train.lr=0.001 (the run's own) *" in out and "failed: stopped" in out
    assert "best on heldout: train.lr=0.003, 1.600, +0.100 over train.lr=0.001" in out
    assert "1.500 (0.50 / 0.25; 1.000)" in out
