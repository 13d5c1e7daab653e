"""What crosses rooms, typed: a step's report as the engine reads it, the manifest's record of a step, and
the counts a step records that another room reads back (prepare's rows, extract's samples, ...).

A report is a plain dict at runtime (it becomes JSON); the TypedDicts name the keys a reader relies on.
Python 3.11's TypedDict has no `extra_items`: a room's own detail rides beside these keys in the same
dict, and only the room that wrote it reads it.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

# What the summary shows of a step, by the names in its row of the step table (specops.contract.step_table). A figure is
# whatever JSON the step's room measured: the engine copies it, it never reads inside.
Figures = dict[str, object]


class StepReport(TypedDict, total=False):
    """A step's report, as the engine reads it (engine.run_pipeline, engine.figures, engine.runs_here)."""

    step: str
    status: str  # "done" when absent; "skipped: unchanged", "part I of K", "stopped", ...
    figures: Figures  # its summary figures, named in its row of the step table
    saver: int  # train: the node rank of the host whose trainer saved (where a SAVER step runs)


class StepRecord(TypedDict, total=False):
    """One step's record in the run's manifest.json (run.manifest)."""

    status: str  # "running", "done", "failed", "stopped", "part I of K"
    inputs_hash: str
    inputs: dict[str, Any]  # the step's own inputs: their shape is the step's
    versions: dict[str, str | None]
    revision: dict[str, Any] | None  # what the control side's sync recorded
    started_at: str
    finished_at: str
    seconds: float
    counts: dict[str, Any]  # one of the *Counts below, by step
    quick_hash: str  # evaluate: its inputs with the prompts' source in place of their ids


class RegenerateCounts(TypedDict):
    """regenerate's counts: what regenerate.output.check found in the answers, and what the source left out."""

    rows: int
    conversations: int
    failed: int
    empty: int
    missing: int
    completion_tokens: int
    finish_reasons: dict[str, int]
    held_out: int
    source_malformed: int
    answered: NotRequired[int]  # source conversations asked (a prefix; a share records none)
    complete: NotRequired[bool]  # every conversation asked: read by a later regenerate asking for more rows


class PrepareCounts(TypedDict):
    """prepare's counts; extraction reads rows and samples_asked, validation rows."""

    rows: int  # N: the rows every later step reads
    samples_asked: int | None  # the N asked (None: every usable row)
    source_lines: list[int]
    tokens: int
    loss_tokens: int
    truncated: int
    malformed: int
    skipped: int
    held_out: int
    regenerated: bool


class ExtractCounts(TypedDict):
    """extract's counts; validation, the plan and the vllm room read samples."""

    samples: int  # rows 0..samples-1 are whole on disk (a part: this host's share of them)
    written: NotRequired[int]
    regenerated: NotRequired[int]  # files there but not whole, written again
    tokens_written: NotRequired[int]
    bytes_written: NotRequired[int]


class TrainCounts(TypedDict):
    epochs: int  # finished epochs on disk
    exit_code: int


class EvaluateCounts(TypedDict):
    mean_acceptance_length: float
    untrained: float  # the untrained draft's mean acceptance length
    prompts: int
    backend: str


class DraftCounts(TypedDict):
    """Drafting counts: of the hf replay (evaluation.replay), or a server's spec-decode counters."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: list[int]
    generated_tokens: NotRequired[int]  # the replay's


class Acceptance(TypedDict):
    """A draft's acceptance (evaluation.report.figures): the evaluate report's, a sweep's cell, and each epoch's
    score that training records and `train.stop_if` reads."""

    mean_acceptance_length: float  # 1 + accepted / drafts
    acceptance_rate: float
    per_position_acceptance: list[float]
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    prompts: int
    checkpoint: str
    backend: str
    tokens_per_s_spec: NotRequired[float | None]  # served: with the draft, and the target alone
    tokens_per_s_base: NotRequired[float | None]
    speedup: NotRequired[float | None]
