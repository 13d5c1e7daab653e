"""What the engine hands a step: the run, its effective settings (resolved once), and the hosts the run spans.

A step's own room holds its pipeline function, `pipeline_step(context) -> report` (the engine imports it
by the step table's name, specops.contract.step_table); the report's `figures` are what the pipeline's summary shows
of the step (their names are in its row). With one host, `context.hosts` is `OneHost`: every exchange is a no-op. With K
hosts it is the rendezvous of the engine's nodes (pipeline.hosts): a step whose scope is a share per
host writes its share, then makes the shares whole through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from specops.pipeline.hosts import TorchrunNode

if TYPE_CHECKING:
    from specops.pipeline.run.config import Run
    from specops.pipeline.run.reports import Figures, StepReport
    from specops.pipeline.run.settings import EffectiveSettings


class Hosts(Protocol):
    rank: int                  # this host's place (0: the first host, the rendezvous)
    count: int
    names: list[str]           # every host's name, by rank

    def barrier(self, tag: str) -> None:
        """Wait for every host to reach `tag`; raises CheckFailed naming a host that failed or went silent."""

    def all_gather(self, tag: str, value: Any) -> list[Any]:
        """Every host's `value` (JSON), by rank."""

    def exchange(self, tag: str, folder: Path, mine: list[str], lacking: bool) -> dict[str, Any]:
        """Every host's files `mine` (names relative to `folder`) onto every host whose `lacking` is true,
        each written beside its final name and renamed in; what went where."""

    def fail(self, message: str) -> None:
        """Tell every host this one failed (they stop at their next wait, naming it)."""

    def gone(self, after_s: float | None = None) -> str | None:
        """Without waiting: a host that failed, or went silent for `after_s` (default: the rendezvous'
        SILENT_S), named in one line; None while every host is heard."""

    def close(self) -> None:
        """Leave the run's rendezvous (node 0 stops hosting it)."""


@dataclass
class OneHost:
    rank: int = 0
    count: int = 1
    names: list[str] = field(default_factory=lambda: ["this host"])

    def barrier(self, tag: str) -> None:
        return None

    def all_gather(self, tag: str, value: Any) -> list[Any]:
        return [value]

    def exchange(self, tag: str, folder: Path, mine: list[str], lacking: bool) -> dict[str, Any]:
        return {"copies": [], "bytes": 0}

    def fail(self, message: str) -> None:
        return None

    def gone(self, after_s: float | None = None) -> str | None:
        return None

    def close(self) -> None:
        return None


@dataclass
class StepContext:
    run: Run
    samples: int | None        # --samples, else the run's `samples` (applied once, by the engine)
    settings: EffectiveSettings  # the run's effective settings on this host (run.settings.resolve, once)
    hosts: Hosts = field(default_factory=OneHost)
    reports: dict[str, StepReport] = field(default_factory=dict)  # earlier steps' reports, this pipeline
    training: TorchrunNode | None = None  # this host's torchrun node when the training spans the hosts
    reading_for: str | None = None  # `step X` running the steps X reads (engine.run_step): X; else None
    epochs: int | None = None  # `pipeline --only train --epochs N` (invoke train --hosts): train.epochs overridden
    fresh: bool = False        # `pipeline --only train --fresh`: the training starts over in a new folder
    # a role split (the run's hosts: {serve, train}): the ranks that train; every other host serves. Empty:
    # every host does every step's share
    train_ranks: tuple[int, ...] = ()

    @property
    def backend(self) -> str:
        """The run's backend on this host (hf | vllm): the settings' one answer."""
        return self.settings.backend

    @property
    def name(self) -> str:
        """This host's name, as the messages of a run across hosts show it."""
        return self.hosts.names[self.hosts.rank]


def shares_of(report: StepReport | None) -> Figures | None:
    """A share-per-host step's share and exchange across hosts, as its summary figure (None on one host)."""
    if not report or "exchanged" not in report:
        return None
    keys = ("part", "share_status", "written", "shares", "exchanged")
    return {key: report[key] for key in keys if key in report}
