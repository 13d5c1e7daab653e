"""The train step skips a training its manifest records only while the checkpoints are on disk: a finished
run's checkpoint folder deleted or moved by hand is trained again, not reported "skipped: unchanged" (and then
found missing by evaluate). Decided before the parity gate, which stands in here for the training."""

from __future__ import annotations

from pathlib import Path

import pytest

from specops.contract.errors import CheckFailed
from tests.support.finished import copy_of


def would_train(plan: object, gpus: int) -> dict:
    raise CheckFailed("the gate was reached: the step would train")


def test_a_recorded_training_whose_checkpoints_are_gone_is_trained_again(
        finished: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_of(finished, tmp_path / "w")
    monkeypatch.setenv("SPECOPS_WORKDIR", str(root))
    from specops.pipeline import open_run
    from specops.pipeline.training import train_step

    run = open_run("tiny")
    code, document = train_step(run, fresh=False, epochs=None, gpus=0, dry_run=False, gate=would_train)
    assert code == 0 and document["status"] == "skipped: unchanged"

    checkpoints = root / "runs" / "tiny" / "checkpoints"
    last = max((path for path in checkpoints.iterdir() if path.name.isdigit()), key=lambda path: int(path.name))
    last.rename(tmp_path / "moved-away")
    with pytest.raises(CheckFailed, match="the gate was reached"):
        train_step(run, fresh=False, epochs=None, gpus=0, dry_run=False, gate=would_train)
