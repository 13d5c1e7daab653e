"""The other hosts of a training across hosts, watched beside this host's trainer.

torchrun alone does not end a node whose peer went silent: its trainer waits in a collective (gloo: 30
minutes) or at the exit barrier. The engine's rendezvous hears every node's beat, so while the trainer
runs a watch asks it (`Hosts.gone`) every beat: a node that failed or is silent for SILENT_S stops this
host's trainer, and the step fails with one line naming that host. When the trainer ends on its own with
an error (its collective broke as a peer died), `cause` looks a few beats longer for a peer that stopped
beating, so the line names the host that went, not the trainer that followed it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

PERIOD_S = 2.0       # the rendezvous' beat
AFTER_FAILURE_S = 10.0  # a trainer failed: a peer not heard for this long (or SILENT_S if shorter) is named


class PeerWatch:
    """A trainer's guard (command.run_training): stops the trainer once `gone()` names a reason."""

    def __init__(self, gone: Callable[..., str | None], period_s: float = PERIOD_S) -> None:
        self.gone, self.period_s = gone, period_s
        self.trainer_pid: int | None = None
        self.reason: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, stop_trainer: Callable[[], None]) -> None:
        def loop() -> None:
            while not self._stop.wait(self.period_s):
                reason = self.gone()
                if reason:
                    self.reason = reason
                    stop_trainer()
                    return

        self._thread = threading.Thread(target=loop, name="specops-peers", daemon=True)
        self._thread.start()

    def pending_line(self) -> str | None:
        return None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def cause(self, within_s: float = AFTER_FAILURE_S) -> str | None:
        """After the trainer failed by itself: a peer that failed, or stopped beating, within a few beats."""
        deadline = time.monotonic() + within_s + 2 * self.period_s
        while True:
            reason = self.gone(within_s)
            if reason or time.monotonic() >= deadline:
                return reason
            time.sleep(self.period_s / 4)
