"""The run manifest: what produced each step's outputs, so unchanged steps are skipped.

<run>/manifest.json holds one record per step: the hash of the step's inputs (its config section
plus the hashes of the steps it reads from), package versions, the synced revision, counts and
timings. When a step's inputs change, every step that depends on it is invalidated: its record
and its outputs go, so outputs of two configs never mix.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from specops.contract import step_table
from specops.contract.errors import BadInput
from specops.host import atomic
from specops.host.installed import version_of
from specops.host.paths import workdir
from specops.pipeline.run.reports import StepRecord

# Which steps read the outputs of which, and each step's output folders (relative to the run folder):
# from the step table, the one place that lists the steps.
DEPENDS_ON: dict[str, list[str]] = step_table.depends_on()
OUTPUTS: dict[str, list[str]] = step_table.outputs()
# Outputs too costly to delete outright: moved aside instead.
KEEP_ASIDE = {"checkpoints"}
# A trained draft is never retired silently. A step whose re-run drops a finished training moves the dropped
# steps' outputs and records to <run>/retired/<stamp>/ and says so (undone by `invoke restore`); the commands
# that do not train (`step prepare|extract`) set GUARD and refuse instead (exit 2, naming --retire) unless
# given --retire.
GUARD: ContextVar[bool] = ContextVar("guard_trained_draft", default=False)
RETIRE_FLAG = "--retire"
# What a retirement sets aside: the trained draft and what describes it (vocab, evaluation). What they were made
# from (prepared rows, hidden states: often hundreds of GB) is made again from the run config, as before.
RESULTS = ("vocab", "train", "evaluate")
RETIRED = "retired"

PACKAGES = ["torch", "transformers", "tokenizers", "datasets", "safetensors", "speculators", "vllm", "specops"]


def package_versions() -> dict[str, str | None]:
    return {name: version_of(name) for name in PACKAGES}


def synced_revision() -> dict[str, Any] | None:
    """What the control side's sync recorded about the agent's source revision, if anything."""
    path = workdir() / "state" / "revision.json"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def dependents(step: str) -> list[str]:
    """Every step that reads, directly or not, from step's outputs."""
    found: list[str] = []
    frontier = [step]
    while frontier:
        current = frontier.pop()
        for name, parents in DEPENDS_ON.items():
            if current in parents and name not in found:
                found.append(name)
                frontier.append(name)
    return found


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class Outcome:
    """What a recorded step's work fills in: its counts, and its status when not plainly done."""

    counts: Mapping[str, object] = field(default_factory=dict)  # the step's *Counts (run.reports)
    status: str = "done"
    record: StepRecord = field(default_factory=lambda: StepRecord())  # the finished record, after the block


class Manifest:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / "manifest.json"
        try:
            self.document = json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            self.document = {}
        self.document.setdefault("steps", {})

    @property
    def steps(self) -> dict[str, StepRecord]:
        return self.document["steps"]

    def record(self, step: str) -> StepRecord | None:
        return self.steps.get(step)

    def inputs_hash(self, step: str) -> str | None:
        record = self.record(step)
        return record.get("inputs_hash") if record else None

    def is_current(self, step: str, inputs_hash: str) -> bool:
        """Done with these very inputs (which include the hashes of the steps it reads from)."""
        record = self.record(step)
        return bool(record and record.get("status") == "done" and record.get("inputs_hash") == inputs_hash)

    def _begin(self, step: str, inputs_hash: str, inputs: dict[str, Any], keep: tuple[str, ...] = ()) -> float:
        """Mark step as running with these inputs; different earlier inputs invalidate it first.

        keep: dependents whose outputs stay valid through this re-run (per-row files when only the
        number of rows changes); every other dependent is dropped."""
        previous = self.inputs_hash(step)
        changed = previous is not None and previous != inputs_hash
        dropping = [name for name in ([step] if changed else []) + dependents(step) if changed or name not in keep]
        if self.trained_draft(dropping):
            self.retire(dropping, because=step)
        if changed:
            self.invalidate(step)
        elif previous is None and step != "validate":
            self._remove_outputs(step)  # outputs without a record cannot be trusted
        for later in dependents(step):
            if later not in keep:
                self._drop(later)
        started = time.time()
        self.steps[step] = StepRecord(status="running", inputs_hash=inputs_hash, inputs=inputs,
                                      versions=package_versions(), revision=synced_revision(), started_at=now())
        self.save()
        return started

    def _finish(self, step: str, started: float, counts: Mapping[str, object], status: str = "done") -> StepRecord:
        record = self.steps[step]
        record.update(status=status, counts=dict(counts), finished_at=now(), seconds=round(time.time() - started, 3))
        self.save()
        return record

    @contextmanager
    def recorded(self, step: str, inputs_hash: str, inputs: dict[str, Any],
                 keep: tuple[str, ...] = ()) -> Iterator[Outcome]:
        """A step's one manifest sequence, the only place it is written: begin, the block's work, finish with
        what the block put in the outcome; a block that raises records the step failed (with the counts it
        had) and the error goes on. keep: as for _begin (regenerate answering more of the same prompts)."""
        started = self._begin(step, inputs_hash, inputs, keep)
        outcome = Outcome()
        try:
            yield outcome
        except Exception:
            self._finish(step, started, outcome.counts, status="failed")
            raise
        outcome.record = self._finish(step, started, outcome.counts, status=outcome.status)

    def trained_draft(self, dropping: list[str]) -> str | None:
        """What of a finished training `dropping` would drop ("6 epochs in checkpoints/"), else None."""
        record = self.record("train")
        folder = self.run_dir / "checkpoints"
        if "train" not in dropping or not record or not folder.is_dir():
            return None
        epochs = (record.get("counts") or {}).get("epochs")
        return f"{epochs} epoch(s) in {folder}" if epochs else None

    def refuse_retiring(self, dropping: list[str], because: str) -> None:
        """Exit 2 (one line naming --retire) when re-running `because` would drop a finished training, under GUARD."""
        trained = self.trained_draft(dropping)
        if trained and GUARD.get():
            others = " and ".join(name for name in dropping if name in RESULTS and name != "train") or "other"
            raise BadInput(f"{self.run_dir.name}: the {because} step would retire the trained draft ({trained}) "
                           f"and its {others} results; pass "
                           f"{RETIRE_FLAG} to set them aside in {self.run_dir / RETIRED}/ (undo: "
                           f"`invoke restore --run {self.run_dir.name}`), or ask for what was "
                           "trained on (e.g. the --samples it used)")

    def retire(self, dropping: list[str], because: str) -> Path:
        """Move the outputs and records of `dropping` to <run>/retired/<stamp>/ and say so (refused under GUARD:
        `step prepare|extract` without --retire); `invoke restore` (agent: `run restore`) brings them back."""
        self.refuse_retiring(dropping, because)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        into, number = self.run_dir / RETIRED / stamp, 1
        while into.exists():  # two retirements in one second
            number += 1
            into = self.run_dir / RETIRED / f"{stamp}-{number}"
        into.mkdir(parents=True)
        moved = []
        kept = [name for name in dropping if name in RESULTS]  # the rest (hidden states, ...) is made again
        for name in kept:
            for folder in OUTPUTS.get(name, []):
                path = self.run_dir / folder
                if path.exists():
                    (into / folder).parent.mkdir(parents=True, exist_ok=True)
                    path.rename(into / folder)
                    moved.append(folder)
        records = {name: self.steps[name] for name in kept if name in self.steps}
        atomic.write_json(into / "manifest.json", {"because": because, "steps": records, "folders": moved,
                                                   "retired_at": now()})
        print(f"specops: retired {', '.join(records) or 'nothing recorded'} ({', '.join(moved) or 'no folders'}) "
              f"to {into}; undo: invoke restore --run {self.run_dir.name} --retired {into.name}",
              file=sys.stderr)
        return into

    def restore(self, stamp: str | None) -> dict[str, Any]:
        """Bring a retired set back (the newest without `stamp`): what is there now of those steps is retired
        in its turn, so nothing is lost either way."""
        root = self.run_dir / RETIRED
        found = root.iterdir() if root.is_dir() else iter(())
        sets = sorted(path.name for path in found if (path / "manifest.json").is_file())
        if not sets or (stamp is not None and stamp not in sets):
            known = ", ".join(sets) or "none"
            raise BadInput(f"--retired: {stamp or 'a retired set'} not found in {root} (there: {known})")
        source = root / (stamp or sets[-1])
        document = json.loads((source / "manifest.json").read_text())
        names = list(document["steps"])
        current = [name for name in names if name in self.steps
                   or any((self.run_dir / folder).exists() for folder in OUTPUTS.get(name, []))]
        swapped = None
        if current:
            token = GUARD.set(False)
            try:
                swapped = self.retire(current, because="restore")
            finally:
                GUARD.reset(token)
        for folder in document["folders"]:
            (source / folder).rename(self.run_dir / folder)
        self.steps.update(document["steps"])
        self.save()
        shutil.rmtree(source)
        return {"restored": names, "folders": document["folders"], "from": str(source),
                "retired_now": str(swapped) if swapped else None}

    def invalidate(self, step: str) -> list[str]:
        """Forget step and everything downstream of it, outputs included."""
        gone = [step, *dependents(step)]
        for name in gone:
            self._drop(name)
        self.save()
        return gone

    def _drop(self, step: str) -> None:
        self.steps.pop(step, None)
        self._remove_outputs(step)

    def _remove_outputs(self, step: str) -> None:
        for folder in OUTPUTS.get(step, []):
            path = self.run_dir / folder
            if not path.exists():
                continue
            if folder in KEEP_ASIDE:
                path.rename(path.with_name(f"{folder}.superseded-{int(time.time())}"))
            else:
                shutil.rmtree(path)

    def save(self) -> None:
        atomic.write_json(self.path, self.document)
