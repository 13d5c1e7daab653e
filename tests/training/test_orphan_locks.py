"""The staging folder an online training shares with its server is left empty: a lock file vLLM's hidden-states
connector wrote beside a states file the trainer has loaded and deleted is removed when the training ends (a read
that timed out on a loaded machine leaves it; seen in tests/vllm/test_role_split.py), never a lock still held by a
writer, nor one whose states are still to be read."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from specops.pipeline.training.online import orphan_locks_removed


def test_only_locks_of_states_already_read_and_held_by_nobody_are_removed(tmp_path: Path) -> None:
    (tmp_path / "unread.safetensors").write_bytes(b"states")
    (tmp_path / "unread.safetensors.lock").touch()
    (tmp_path / "read.safetensors.lock").touch()  # its states were loaded and deleted: an orphan
    held = tmp_path / "writing.safetensors.lock"
    held.touch()
    fd = os.open(held, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a writer still at work (another open file description holds it)
    try:
        assert orphan_locks_removed(tmp_path) == 1
    finally:
        os.close(fd)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "unread.safetensors", "unread.safetensors.lock", "writing.safetensors.lock"]
    assert orphan_locks_removed(tmp_path / "absent") == 0
