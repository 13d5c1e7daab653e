"""The step table: every step of a run, in the order the engine runs them. Pure data.

The one place that says which steps there are and in what order. Derived from it: the manifest's
dependencies and output folders (pipeline.run.manifest), the engine's order and scopes
(pipeline.engine), and the step lists of `--help` on both sides. Standard library only: the control
side (remote/) reads it too and never imports specops.pipeline.

Adding a step = one row here + the step's own room (its `pipeline_step(context)`, which the engine's
`step_functions()` imports, so import-linter and a reader see the engine -> room arrow).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Scope(StrEnum):
    """Where a step runs when a run spans K hosts (K = 1: the one host, whatever the scope)."""

    EVERY_HOST = "every host"            # each host runs it on its own copy of the run
    SHARE_PER_HOST = "a share per host"  # host i of K does share i; the step's room makes them whole
    FIRST_HOST = "the first host"        # node 0 runs it, the others wait
    SAVER = "the host that saved the checkpoint"  # the trainer's global rank 0 (c10d picks it)


@dataclass(frozen=True)
class Step:
    name: str
    reads: tuple[str, ...]   # the steps whose outputs it reads: a change there invalidates it
    writes: tuple[str, ...]  # its output folders under the run folder (moved or removed on invalidation)
    enabled_by: str | None   # the run config's boolean key or property that turns it on ("regenerate.enabled",
                             # "hidden_states.extracts"); None: always
    scope: Scope
    summary: str             # one line for --help
    figures: tuple[str, ...] = ()  # what its report's "figures" gives the pipeline's summary (None where it
                                   # did not run)
    recorded: bool = True    # has a manifest record (its inputs hash decides whether it skips)


STEPS: tuple[Step, ...] = (
    Step("patches", (), (), None, Scope.EVERY_HOST, "apply and verify the patch sets that fit the host",
         recorded=False),
    Step("regenerate", (), ("regenerated",), "regenerate.enabled", Scope.SHARE_PER_HOST,
         "the target answers the conversations' prompts", ("regenerate",)),
    Step("prepare", ("regenerate",), ("prepared", "heldout"), None, Scope.EVERY_HOST,
         "tokenise, loss mask, token frequencies, held-out prompts", ("tokens", "loss_tokens")),
    # off in hidden_states.mode online (the trainer asks the run's server for every row); in hybrid the
    # extraction room writes only the leading rows the disk budget holds
    Step("extract", ("prepare",), ("hidden_states",), "hidden_states.extracts", Scope.SHARE_PER_HOST,
         "the target's hidden states at the run's layers", ("samples", "extract")),
    Step("validate", ("extract",), (), "hidden_states.extracts", Scope.FIRST_HOST,
         "every file whole, fidelity to the target", ("fidelity",)),
    Step("vocab", ("prepare",), ("vocab",), None, Scope.EVERY_HOST, "the draft vocabulary (d2t/t2d)",
         ("coverage",)),
    # its report names the host whose trainer saved (`saver`, a node rank): where a SAVER step runs
    Step("train", ("vocab", "extract"), ("checkpoints",), None, Scope.SHARE_PER_HOST,
         "the parity gate, then speculators trains the draft (one torchrun node a host)",
         ("loss_first", "loss_last", "epochs", "plot", "resume", "saved_on", "synced", "roles")),
    Step("evaluate", ("train",), ("evaluation",), "evaluate.enabled", Scope.SAVER,
         "the draft's acceptance on held-out prompts", ("evaluation",)),
)


def names() -> list[str]:
    return [step.name for step in STEPS]


def step(name: str) -> Step:
    for entry in STEPS:
        if entry.name == name:
            return entry
    raise KeyError(name)


def depends_on() -> dict[str, list[str]]:
    """{step: the recorded steps it reads}: what the manifest invalidates along."""
    return {entry.name: list(entry.reads) for entry in STEPS if entry.recorded}


def outputs() -> dict[str, list[str]]:
    return {entry.name: list(entry.writes) for entry in STEPS if entry.recorded}


def enabled(entry: Step, config: Any) -> bool:
    """Whether the run config turns the step on (`enabled_by` read off the config's attributes)."""
    if entry.enabled_by is None:
        return True
    value: Any = config
    for part in entry.enabled_by.split("."):
        value = getattr(value, part)
    return bool(value)


def sequence(arrow: str = " → ") -> str:
    """The steps in order, as `--help` shows them."""
    return arrow.join(names())
