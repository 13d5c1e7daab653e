"""The `regenerate` step: inputs, the manifest's skip decision, the backend, the output check.

Inputs (regenerate.inputs): the data file's digest, the target's digest (config and weights) and tokenizer, the
sampling settings, the held-out size (held-out prompts are not answered) and the backend. A
changed target changes them, so regenerate runs again and everything after it (prepare → ...) is
invalidated, as the manifest does for every step. A rerun with the same inputs after a kill
resumes: the hf backend from its finished batches, the vllm one with speculators' `--resume`.
"""

from __future__ import annotations

import sys

from specops.contract.errors import CheckFailed
from specops.pipeline.regenerate.backends import Backend, backend_for
from specops.pipeline.regenerate.inputs import regenerate_inputs
from specops.pipeline.run import Run, StepContext, StepRecord, StepReport, config_hash, dependents, shares_of


def enough_answers(run: Run, record: StepRecord, samples: int | None) -> bool:
    """The answers on disk serve `samples` rows (None: every conversation answered)."""
    from specops.pipeline.data import regenerated

    if record.get("counts", {}).get("complete", True):  # records of whole runs, older ones included
        return True
    return samples is not None and regenerated.usable_rows(run.paths.regenerated, run.config.max_seq_len) >= samples


def regenerate(run: Run, backend: Backend, *, samples: int | None = None) -> StepReport:
    """Run (or skip, or resume, or extend) the regenerate step on this host; the step's report.

    `samples` N: answer the conversations in source order only until prepare has N rows to take
    (`extract --samples 10` needs ten answers, not the whole dataset's); a later call asking for
    more, or for all (None), answers the rest, and the first answers stay the same bytes. A host's share
    of a run across hosts and the check of the merged answers are regenerate.shares'."""
    from specops.pipeline.regenerate.output import ERRORS_FILE, RESPONSES_FILE, check, counts_of, failure_lines
    from specops.pipeline.regenerate.source import build_source, read_source
    from specops.pipeline.run import Manifest

    folder = run.paths.regenerated
    inputs = regenerate_inputs(run, backend.name)
    inputs_hash = config_hash(inputs)
    manifest = Manifest(run.paths.run_dir)
    record = manifest.record("regenerate") or {}
    if (manifest.is_current("regenerate", inputs_hash) and (folder / RESPONSES_FILE).is_file()
            and enough_answers(run, record, samples)):
        return {"step": "regenerate", "status": "skipped: unchanged", "backend": backend.name,
                "inputs_hash": inputs_hash, "counts": record.get("counts", {}), "output": str(folder / RESPONSES_FILE)}
    resuming = record.get("inputs_hash") == inputs_hash
    # other inputs: old answers go, and all that was made of them; the same inputs answer more of the
    # same prompts, and the first answers (all that prepare's rows were made of) stay as they are
    with manifest.recorded("regenerate", inputs_hash, inputs,
                           keep=tuple(dependents("regenerate")) if resuming else ()) as outcome:
        source_counts = build_source(run)
        source = read_source(folder)
        wanted = f"until {samples} rows can be prepared, " if samples is not None else ""
        print(f"regenerate: {len(source)} conversations ({source_counts['held_out']} held out), {wanted}with the "
              f"{backend.name} backend{' (resuming)' if resuming else ''}", file=sys.stderr, flush=True)
        details = backend.answer(run, folder, source, samples=samples)
        answered = details.pop("answered", len(source))  # conversations answered: a prefix of the source
        checked = check(folder, source[:answered])
        counts = outcome.counts = {**counts_of(checked, source_counts), "answered": answered,
                                   "complete": answered == len(source)}
        for line in failure_lines(checked["failed_list"], folder / ERRORS_FILE):
            print(line, file=sys.stderr)
        if checked["problems"] or checked["rows"] == 0:
            why = "; ".join(checked["problems"]) or "no answers were written"
            raise CheckFailed(f"regenerate: {folder / RESPONSES_FILE}: {why}")
    print(f"regenerate: {counts['rows']} answers for {counts['conversations']} conversations, "
          f"{counts['failed']} failed, {counts['empty']} empty"
          f"{'' if counts['complete'] else f' ({answered} of {len(source)} conversations asked so far)'}",
          file=sys.stderr, flush=True)
    return {"step": "regenerate", "status": "done", "backend": backend.name, "inputs_hash": inputs_hash,
            "counts": counts, "failed": checked["failed_list"], "missing": checked["missing_list"],
            "output": str(folder / RESPONSES_FILE), **details}


def pipeline_step(context: StepContext) -> StepReport:
    """The pipeline's regenerate: as many answers as prepare's N rows need, by the run's settings' backend;
    across hosts, each host answers its share and every host joins all of them (regenerate.shares)."""
    backend = backend_for(context.settings.regenerate_backend)
    if context.hosts.count == 1:
        return regenerate(context.run, backend, samples=context.samples)
    from specops.pipeline.regenerate.shares import across_hosts

    report = across_hosts(context, backend)
    return {**report, "figures": {"regenerate": shares_of(report)}}
