"""The snapshot rules of `fetch-list` on checkpoint folders laid out as speculators 0.9.0 writes them
(files first, then the `epoch<N>_end` link): what counts as finished, and a growing log's prefix."""

from __future__ import annotations

import os
from pathlib import Path

from specops.pipeline.fetch import copy_log_prefix, finished_checkpoints
from specops.pipeline.training.command import CHECKPOINT_FILES


def _checkpoint(root: Path, epoch: int, when_ns: int, *, link: bool = True) -> Path:
    folder = root / str(epoch)
    folder.mkdir()
    for name in CHECKPOINT_FILES:
        (folder / name).write_text(name)
        os.utime(folder / name, ns=(when_ns, when_ns))
    if link:
        (root / f"epoch{epoch}_end").symlink_to(str(epoch))
        os.utime(root / f"epoch{epoch}_end", ns=(when_ns + 10, when_ns + 10), follow_symlinks=False)
    return folder


def test_only_linked_complete_and_untouched_checkpoints_are_finished(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 0, 1_000)
    _checkpoint(tmp_path, 1, 2_000)
    being_written = _checkpoint(tmp_path, 2, 3_000, link=False)
    assert [epoch for epoch, _link, _folder in finished_checkpoints(tmp_path)] == [0, 1]

    (being_written.parent / "1" / "model.safetensors").write_text("the trainer rewrites epoch 1")
    assert [epoch for epoch, _link, _folder in finished_checkpoints(tmp_path)] == [0]

    (tmp_path / "0" / "training_state.json").unlink()
    assert finished_checkpoints(tmp_path) == []


def test_a_growing_log_is_copied_up_to_its_last_whole_line(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"step 1\nstep 2\nstep 3 half")
    taken = copy_log_prefix(log, tmp_path / "copy.log")
    assert taken == {"offset": 14, "size_at_snapshot": 25}
    assert (tmp_path / "copy.log").read_bytes() == b"step 1\nstep 2\n"
