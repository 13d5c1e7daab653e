"""One extraction plan for both backends: what is on disk against what the run asks for.

Files of rows 0..N-1 already on disk are kept when the manifest says they come from the same
inputs and their headers are whole; every other row is to be (re)written. Decided once, before
any model is loaded or any server is needed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput, CheckFailed
from specops.pipeline.extraction.hidden_states import (
    file_for,
    inputs_backend,
    remove_temporaries,
    stored_dtype,
    verify_header,
)

if TYPE_CHECKING:
    from specops.pipeline.run import Manifest, Outcome, Run, StepReport


def prepared_rows(run: Run, samples: int | None) -> tuple[str, list[int]]:
    """(the prepare step's inputs hash, token counts of prepared rows 0..N-1), N = `samples` (the caller's, the
    run's default already applied: Run.samples_for, once), None: every row prepare wrote. Read from prepare's
    output, never made here: the step table runs prepare before extract (`step extract` and the pipeline
    alike); missing, or made for fewer rows, is one line naming the step to run. Rows prepared for a larger N
    begin with the rows of a smaller one."""
    from specops.pipeline.data import saved
    from specops.pipeline.run import Manifest

    record = Manifest(run.paths.run_dir).record("prepare") or {}
    if record.get("status") != "done" or not (run.paths.prepared / "dataset_info.json").exists():
        raise BadInput(f"{run.paths.prepared}: no prepared rows recorded; run the prepare step first "
                       "(`step extract` runs it)")
    lengths = saved.column(run.paths.prepared, "seq_len")
    if samples is None:
        return record["inputs_hash"], lengths
    if samples <= len(lengths):
        return record["inputs_hash"], lengths[:samples]
    asked = record.get("counts", {}).get("samples_asked")
    if asked is None or len(lengths) < asked:  # prepare took every usable row: there are no more
        return record["inputs_hash"], lengths
    raise BadInput(f"{run.paths.prepared}: {len(lengths)} rows prepared, extract asks for {samples}; run the "
                   "prepare step with that --samples first (`step extract` runs it)")


def backend_input(run: Run) -> dict[str, str]:
    """The extract inputs' hidden-states backend: absent for file (inputs_backend reads absent as file), so runs
    extracted before backends existed keep their hash."""
    backend = run.config.hidden_states.backend
    return {} if backend == "file" else {"hidden_states_backend": backend}


def row_count(lengths: list[int]) -> int:
    """N: every row `prepared_rows` read (rows 0..N-1 of prepare's output)."""
    return len(lengths)


def rows_to_extract(run: Run, lengths: list[int], dtype: str, host_gpus: int) -> int:
    """The rows extract writes, by the run's `hidden_states.mode`: every prepared row (offline), none
    (online: the trainer asks the server for each), or the leading rows whose files fit the disk budget
    beside the files the trainer will have in flight from the server (hybrid)."""
    from specops.pipeline.extraction import budget
    from specops.pipeline.target import hidden_size

    settings = run.config.hidden_states
    dtype = stored_dtype(dtype, settings.backend)
    if settings.mode == "offline":
        return row_count(lengths)
    if settings.mode == "online":
        return 0
    layers, hidden = len(run.layer_ids()), hidden_size(run)
    in_flight = budget.in_flight_rows(run.config.train.loader_workers, host_gpus)
    allowance = (budget.budget_bytes(settings.disk_budget_gb) or 0) - budget.in_flight_reserve(
        lengths, layers, hidden, dtype, in_flight)
    return budget.rows_within(lengths, layers, hidden, dtype, max(allowance, 0))


def check_files(folder: Path, lengths: list[int], count: int, n_layers: int, hidden: int,
                dtype: str) -> dict[int, str]:
    """Rows 0..count-1 whose file is missing or not whole, with what is wrong."""
    problems = {}
    for index in range(count):
        problem = verify_header(file_for(folder, index), lengths[index], n_layers, hidden, dtype)
        if problem is not None:
            problems[index] = problem
    return problems


@dataclass
class ExtractionPlan:
    """Done (whole files of these inputs), to redo (files that are not whole), to do (missing)."""

    manifest: Manifest
    inputs: dict[str, Any]
    inputs_hash: str
    lengths: list[int]
    count: int
    hidden: int
    folder: Path
    current: bool  # the recorded extract inputs are these
    problems: dict[int, str]  # files of rows 0..count-1 that are missing or not whole (when current)
    regenerated: dict[int, str] = field(default_factory=dict)

    @property
    def layer_ids(self) -> list[int]:
        return self.inputs["layer_ids"]

    @property
    def dtype(self) -> str:
        return self.inputs["dtype"]

    @property
    def file_dtype(self) -> str:
        """The hidden_states dtype in the files (fp8 for backend fp8)."""
        return stored_dtype(self.dtype, inputs_backend(self.inputs))

    @property
    def unchanged(self) -> bool:
        return (self.current and not self.problems and self.manifest.is_current("extract", self.inputs_hash)
                and self.manifest.record("extract").get("counts", {}).get("samples", 0) >= self.count)

    def skipped(self) -> StepReport:
        # more rows may be on disk (an earlier, larger N): this run's N is what it uses
        counts = {**self.manifest.record("extract")["counts"], "samples": self.count}
        return {"step": "extract", "status": "skipped: unchanged", "inputs_hash": self.inputs_hash,
                "counts": counts}

    @contextmanager
    def recorded(self) -> Iterator[tuple[Outcome, list[int]]]:
        """The step recorded around the block (Manifest.recorded; other inputs: old files are removed first);
        yields (the outcome to fill in, the rows to write). Files there but not whole are removed and
        reported: no writer trusts them."""
        with self.manifest.recorded("extract", self.inputs_hash, self.inputs) as outcome:
            self.folder.mkdir(parents=True, exist_ok=True)
            if not self.current:
                self.problems = {index: "missing" for index in range(self.count)}
            self.regenerated = {index: why for index, why in self.problems.items() if why != "missing"}
            for index, why in self.regenerated.items():
                print(f"extract: hs_{index}.safetensors is not whole ({why}); regenerating", file=sys.stderr)
                file_for(self.folder, index).unlink(missing_ok=True)
            yield outcome, sorted(self.problems)

    def check_written(self, rows: set[int] | None = None) -> dict[int, str]:
        """Files not whole after writing: of rows 0..count-1, or of `rows` only (one host's share)."""
        problems = check_files(self.folder, self.lengths, self.count, len(self.layer_ids), self.hidden,
                               self.file_dtype)
        return {row: why for row, why in problems.items() if rows is None or row in rows}

    def share(self, part: tuple[int, int], rows: set[int]) -> dict[str, Any]:
        """The report of share I of COUNT hosts writing `rows`: its rows as [start, stop) spans, and
        whether every other row's file is already whole here (then nothing is gathered onto this host)."""
        index, total = part
        others_whole = self.current and all(row in rows for row in self.problems)
        return {"index": index, "count": total, "rows": len(rows), "spans": spans(rows), "others_whole": others_whole,
                "inputs_hash": self.inputs_hash, "samples": self.count}

    def require_all_whole(self) -> None:
        """Exit 1 unless every file of rows 0..N-1 is whole and of these inputs (before training on a gather)."""
        if not self.current:
            raise CheckFailed(f"{self.folder}: no extraction of these inputs is recorded on this host "
                              "(its files come from other inputs, or none)")
        if self.problems:
            first = min(self.problems)
            raise CheckFailed(f"{self.folder / f'hs_{first}.safetensors'}: {self.problems[first]} "
                              f"({len(self.problems)} of {self.count} files not whole)")


def spans(rows: set[int] | list[int]) -> list[list[int]]:
    """Rows as sorted [start, stop) runs."""
    runs: list[list[int]] = []
    for row in sorted(rows):
        if runs and runs[-1][1] == row:
            runs[-1][1] = row + 1
        else:
            runs.append([row, row + 1])
    return runs


def plan_extraction(run: Run, lengths: list[int], count: int, inputs: dict[str, Any]) -> ExtractionPlan:
    """Compare the extraction `inputs` (with "layer_ids" and "dtype") and rows 0..count-1 with the disk."""
    from specops.pipeline.run import Manifest, config_hash
    from specops.pipeline.target import hidden_size

    inputs_hash = config_hash(inputs)
    folder, hidden = run.paths.hidden_states, hidden_size(run)
    manifest = Manifest(run.paths.run_dir)
    current = manifest.inputs_hash("extract") == inputs_hash
    problems: dict[int, str] = {}
    if current:
        remove_temporaries(folder)
        problems = check_files(folder, lengths, count, len(inputs["layer_ids"]), hidden,
                               stored_dtype(inputs["dtype"], inputs_backend(inputs)))
    return ExtractionPlan(manifest, inputs, inputs_hash, lengths, count, hidden, folder, current, problems)
