"""Acceptance every epoch: after each epoch the draft is scored on a few fixed held-out prompts while the next
one trains, recorded beside the epoch's metrics and plotted; `train.stop_if` ends a draft that learns nothing
after the configured epoch (exit 1, one line) instead of running every epoch; `evaluate.checkpoint: best` is
the epoch with the highest recorded acceptance, and the report says which and why.
"""

from __future__ import annotations

import json

import pytest

from tests.support.agent import run_agent as agent
from tests.support.finished import copy_of


def _recorded(root) -> dict[int, dict]:
    document = json.loads((root / "runs" / "tiny" / "checkpoints" / "acceptance.json").read_text())
    return {int(epoch): figures for epoch, figures in document["epochs"].items()}


def test_every_epoch_of_the_demo_is_scored_and_shown_beside_its_losses(finished) -> None:
    root, summary = finished
    recorded = _recorded(root)
    assert sorted(recorded) == [row["epoch"] for row in summary["epochs"]] == [0, 1, 2, 3]
    for row in summary["epochs"]:
        figures = recorded[row["epoch"]]
        assert figures["prompts"] == 8 and figures["backend"] == "hf" and figures["num_drafts"] > 0
        assert row["acceptance"]["mean_acceptance_length"] == figures["mean_acceptance_length"]
    assert recorded[3]["mean_acceptance_length"] > recorded[0]["mean_acceptance_length"] - 0.05 > 1.0
    code, metrics, _ = agent(root, "step", "metrics", "--run", "tiny")  # the table and loss.png carry it too
    assert code == 0 and [row["acceptance"]["mean_acceptance_length"] for row in metrics["epochs"]] == [
        recorded[epoch]["mean_acceptance_length"] for epoch in range(4)]
    assert [length for _step, length in metrics["plot_contents"]["acceptance_points"]] == [
        recorded[epoch]["mean_acceptance_length"] for epoch in range(4)]


def test_the_checkpoint_evaluated_as_best_has_the_highest_recorded_acceptance(finished, tmp_path) -> None:
    root, summary = finished
    lengths = {epoch: figures["mean_acceptance_length"] for epoch, figures in _recorded(root).items()}
    best = max(lengths, key=lambda epoch: (lengths[epoch], -epoch))
    evaluation = summary["evaluation"]
    assert evaluation["report"]["checkpoint"] == str(best) == str(evaluation["best"]["epoch"])
    assert evaluation["best"]["why"].startswith(f"epoch {best} has the highest mean acceptance length")

    copy = copy_of(finished, tmp_path / "w")  # the record decides, not the last epoch nor the validation loss
    file = copy / "runs" / "tiny" / "checkpoints" / "acceptance.json"
    document = json.loads(file.read_text())
    document["epochs"]["0"]["mean_acceptance_length"] = max(lengths.values()) + 1.0
    file.write_text(json.dumps(document))
    code, evaluated, stderr = agent(copy, "step", "evaluate", "--run", "tiny", "--prompts", "4", timeout=900)
    assert code == 0, stderr[-3000:]
    assert evaluated["report"]["checkpoint"] == "0" and evaluated["best"]["epoch"] == 0
    assert "epoch 0 has the highest mean acceptance length" in evaluated["best"]["why"]


@pytest.mark.slow  # a dry run, one epoch of training and its score
def test_a_run_that_cannot_learn_stops_after_the_configured_epoch(finished, tmp_path) -> None:
    root = copy_of(finished, tmp_path / "w")
    config = root / "runs" / "tiny.yaml"
    text = config.read_text().replace("  epochs: 4\n", "  epochs: 2\n").replace(
        "  lr: 0.001\n", "  lr: 1.0e-12\n  stop_if: {epoch: 0, acceptance_length_below: 1.1}\n")
    config.write_text(text)

    code, document, stderr = agent(root, "step", "train", "--run", "tiny", timeout=900)

    assert code == 1, stderr[-3000:]
    assert document["error"].startswith("train.stop_if: after epoch 0 the mean acceptance length is 1.0")
    assert "below 1.1" in document["error"] and "\n" not in document["error"]
    checkpoints = root / "runs" / "tiny" / "checkpoints"
    assert (checkpoints / "epoch0_end").is_symlink() and not (checkpoints / "epoch1_end").exists()
    assert sorted(_recorded(root)) == [0] and _recorded(root)[0]["mean_acceptance_length"] < 1.1
    again = agent(root, "step", "train", "--run", "tiny")  # stopped stays stopped while nothing changes
    assert again[0] == 1 and again[1]["error"].startswith("train.stop_if: after epoch 0")


@pytest.mark.parametrize(("stop_if", "error"), [
    ("{epoch: 4, acceptance_length_below: 1.2}", "train.stop_if: epoch 4 is not below train.epochs (4)"),
    ("{epoch: 0, acceptance_length_below: 1.0}", "train.stop_if.acceptance_length_below: must be > 1"),
    ("{epoch: 0}", "train.stop_if.acceptance_length_below: required key is missing"),
    ("{epoch: -1, acceptance_length_below: 1.2}", "train.stop_if.epoch: must be >= 0"),
])
def test_a_bad_stop_if_is_one_line_and_exit_2(tmp_path, stop_if: str, error: str) -> None:
    from tests.support.agent import REPO

    (tmp_path / "runs").mkdir()
    text = (REPO / "runs" / "tiny.yaml").read_text().replace("  lr: 0.001\n", f"  lr: 0.001\n  stop_if: {stop_if}\n")
    (tmp_path / "runs" / "tiny.yaml").write_text(text)
    code, document, _ = agent(tmp_path, "run", "check", "--run", "tiny")
    assert code == 2 and document["error"].startswith(f"runs/tiny.yaml: {error}") and "\n" not in document["error"]


def test_the_epoch_bar_and_table_show_the_epochs_acceptance() -> None:
    import io

    from remote.step_view import StepView
    from specops.contract.protocol import TRAINER_ACCEPTANCE, TRAINER_END, TRAINER_START

    out = io.StringIO()
    view = StepView(out)
    view.feed(f"{TRAINER_START}{json.dumps({'epochs': 2, 'first_epoch': 0, 'steps_per_epoch': 2})}\n"
              "train/loss=0.5, train/full_acc_0=0.25, profile/tokens_per_s=100, epoch=0, global_step=1\n"
              f"{TRAINER_ACCEPTANCE}{json.dumps({'epoch': 0, 'mean_acceptance_length': 1.234, 'prompts': 8})}\n"
              f"{TRAINER_END}\n")
    view.close()
    assert "acc.len 1.234" in out.getvalue() and TRAINER_ACCEPTANCE not in out.getvalue()
