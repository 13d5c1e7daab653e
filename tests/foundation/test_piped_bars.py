"""Piped output prints whole lines (issue 46): the epoch bars written to a pipe kept rich's default 80 columns and
cut the metrics and the ETA (`67… ETA 0:0…`)."""

from __future__ import annotations

import io

from remote.step_view import TrainingBars


def test_epoch_bars_into_a_pipe_are_whole_lines() -> None:
    stream = io.StringIO()  # not a terminal, as `invoke train | tee log` sees it
    bars = TrainingBars(stream, {"epochs": 3, "steps_per_epoch": 4, "first_epoch": 0})
    assert bars.progress.console.width >= 200  # not the 80 columns a pipe gets by default
    for step in range(4):
        bars.feed(f"epoch=0 global_step={step} train/loss=1.2345 train/full_acc_0=0.456 profile/tokens_per_s=1234")
    bars.close()
    shown = stream.getvalue()
    assert "…" not in shown, shown
    assert "loss 1.234" in shown and "tokens/s" in shown and "ETA" in shown, shown
