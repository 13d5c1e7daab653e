"""Acceptance every epoch, while speculators' trainer runs as a subprocess.

speculators 0.9 writes <save_path>/<N>/ and then the link `epochN_end` when epoch N's checkpoint is
complete (its trainer's maybe_save_checkpoint). A watcher thread sees each new link and hands the folder
to a scorer (the evaluation room's acceptance on a few fixed held-out prompts) while the next epoch
trains. The figures are recorded in <save_path>/acceptance.json beside the epoch's metrics, and a marker
line (protocol.TRAINER_ACCEPTANCE) tells the control side's bar.

`train.stop_if: {epoch: N, acceptance_length_below: L}`: the trainer's processes are paused (SIGSTOP)
from the moment epoch N is complete until its acceptance is known, so a draft that learns nothing does
not train on meanwhile; below L, the trainer gets SIGTERM (speculators saves interrupted/ and exits) and
the step ends with one line, exit 1; otherwise it is continued (SIGCONT).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.protocol import TRAINER_ACCEPTANCE
from specops.host import atomic

if TYPE_CHECKING:  # the run room needs pydantic; the training benches import this room without it
    from specops.pipeline.run import Acceptance, StopIf

ACCEPTANCE_FILE = "acceptance.json"
POLL_S = 0.2
_END_LINK = re.compile(r"epoch(\d+)_end")

Scorer = Callable[[int, Path], "Acceptance"]


def recorded(save_path: Path) -> dict[int, dict[str, Any]]:
    """{epoch: figures} recorded for this training's checkpoints."""
    try:
        document = json.loads((save_path / ACCEPTANCE_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {int(epoch): figures for epoch, figures in (document.get("epochs") or {}).items()}


def record(save_path: Path, epoch: int, figures: dict[str, Any]) -> None:
    epochs = {str(key): value for key, value in recorded(save_path).items()}
    epochs[str(epoch)] = figures
    atomic.write_json(save_path / ACCEPTANCE_FILE, {"epochs": dict(sorted(epochs.items(), key=lambda i: int(i[0])))})


def finished_epochs(save_path: Path) -> list[int]:
    """Epochs whose end-of-epoch checkpoint is complete (speculators' `epochN_end` links)."""
    if not save_path.is_dir():
        return []
    return sorted(int(found.group(1)) for entry in save_path.iterdir()
                  if (found := _END_LINK.fullmatch(entry.name)) and entry.is_symlink())


def stop_line(stop_if: StopIf, epoch: int, figures: dict[str, Any]) -> str | None:
    """The one line that ends a draft that learns nothing, or None."""
    if stop_if is None or epoch != stop_if.epoch:
        return None
    length = figures.get("mean_acceptance_length")
    if length is None or length >= stop_if.acceptance_length_below:
        return None
    return (f"train.stop_if: after epoch {epoch} the mean acceptance length is {length:.3f} on "
            f"{figures.get('prompts')} held-out prompts, below {stop_if.acceptance_length_below}: the draft is "
            "not learning; stopped instead of training every epoch")


class EpochWatch:
    """Scores each finished epoch of a running trainer; pauses it on the epoch a stop verdict depends on."""

    def __init__(self, save_path: Path, scorer: Scorer, stop_if: StopIf | None = None) -> None:
        self.save_path = save_path
        self.scorer = scorer
        self.stop_if = stop_if
        self.lock = threading.Lock()  # the trainer's output and our marker lines share stderr
        self.stopped: str | None = None
        self.errors: list[str] = []
        self._done = set(recorded(save_path))
        self._process: subprocess.Popen | None = None
        self._ended = threading.Event()
        self._thread: threading.Thread | None = None

    def attach(self, process: subprocess.Popen) -> None:
        self._process = process
        self._thread = threading.Thread(target=self._watch, name="epoch-acceptance", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        """The trainer has exited: score what it finished last, then return."""
        self._ended.set()
        if self._thread is not None:
            self._thread.join()
        self._scan()

    def _watch(self) -> None:
        while not self._ended.is_set() and self.stopped is None:
            self._scan()
            self._ended.wait(POLL_S)

    def _scan(self) -> None:
        for epoch in finished_epochs(self.save_path):
            if epoch in self._done or self.stopped is not None:
                continue
            self._done.add(epoch)
            decisive = self.stop_if is not None and epoch == self.stop_if.epoch
            paused = self._signal(signal.SIGSTOP) if decisive and not self._ended.is_set() else []
            try:
                self._epoch(epoch)
            finally:
                if self.stopped is not None and self._process is not None and self._process.poll() is None:
                    self._process.send_signal(signal.SIGTERM)  # torchrun forwards it to its workers
                for pid in paused:
                    _kill(pid, signal.SIGCONT)

    def _epoch(self, epoch: int) -> None:
        folder = self.save_path / str(epoch)
        try:
            figures = self.scorer(epoch, folder)
        except Exception as exc:
            self.errors.append(f"epoch {epoch}: {type(exc).__name__}: {exc}")
            self._say(f"specops: acceptance of epoch {epoch} could not be measured: {type(exc).__name__}: {exc}")
            return
        record(self.save_path, epoch, figures)
        self._say(TRAINER_ACCEPTANCE + json.dumps({"epoch": epoch, **{key: figures.get(key) for key in (
            "mean_acceptance_length", "per_position_acceptance", "prompts")}}))
        self.stopped = stop_line(self.stop_if, epoch, figures)

    def _signal(self, signum: int) -> list[int]:
        if self._process is None or self._process.poll() is not None:
            return []
        from specops.jobs.processes import descendants

        pids = [self._process.pid, *descendants(self._process.pid)]
        for pid in pids:
            _kill(pid, signum)
        return pids

    def _say(self, line: str) -> None:
        with self.lock:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
