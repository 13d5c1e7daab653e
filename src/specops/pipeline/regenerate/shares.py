"""Regeneration across hosts: one host's share of the conversations, and the check of the merged answers.

`regenerate_share` (`step regenerate --part I/COUNT`) answers share I of source.jsonl into
regenerated/parts/part-I-of-COUNT/ (its own responses.jsonl and errors file) and records the step as
"part I of COUNT" with the inputs hash a one-host regenerate records. Under the engine, `across_hosts`
copies every share onto every host (the rendezvous' exchange) and joins them; `require_whole`
(`step regenerate --require-whole`) then checks the merged answers cover every conversation and records
the step done, so prepare after it finds regenerate current.

The cut is specops.planning.row_ranges over the source's batches of `concurrency` rows, in source
order: each share is a contiguous run of whole one-host batches, so the hf backend answers every
batch with the very rows and seed one host uses and the merged file is the one-host file byte for
byte (a batch split between hosts would pad its prompts differently). The vllm backend answers a
source file holding only the share (speculators has no rank flag).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from specops.contract.errors import CheckFailed
from specops.host import atomic
from specops.pipeline.shares import shares_fit

if TYPE_CHECKING:
    from specops.pipeline.regenerate.backends import Backend
    from specops.pipeline.run import Run, StepContext, StepReport

PARTS = "parts"


def share_span(total: int, batch: int, part: tuple[int, int]) -> tuple[int, int]:
    """Source rows [start, stop) of share `part` = (index, count): whole batches of `batch` rows."""
    from specops.planning import row_ranges

    batches = -(-total // batch)
    first, last = row_ranges(batches, part[1])[part[0]]
    return min(first * batch, total), min(last * batch, total)


def share_folder(folder: Path, part: tuple[int, int]) -> Path:
    return folder / PARTS / f"part-{part[0]}-of-{part[1]}"


def _slice_whole(folder: Path, share: Path, ids: set[str]) -> None:
    """A share cut out of answers this host already holds whole (a rerun where only another host lacks them)."""
    from specops.pipeline.regenerate.output import ERRORS_FILE, RESPONSES_FILE, read_jsonl

    for name in (ERRORS_FILE, RESPONSES_FILE):  # errors first: the responses file marks the share written
        rows, _broken = read_jsonl(folder / name)
        key = "primary_id" if name == RESPONSES_FILE else "id"
        kept = [row for row in rows if str(row.get(key)) in ids]
        atomic.write_text(share / name, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in kept))


def regenerate_share(run: Run, backend: Backend, part: tuple[int, int]) -> StepReport:
    """Answer share `part` = (index, count) of the run's conversations into its own folder; the share's
    report. The step is recorded with the inputs one host records (regenerate.inputs)."""
    from specops.pipeline.regenerate.inputs import regenerate_inputs
    from specops.pipeline.regenerate.output import ERRORS_FILE, RESPONSES_FILE, check, counts_of
    from specops.pipeline.regenerate.source import build_source, read_source
    from specops.pipeline.run import Manifest, config_hash

    folder = run.paths.regenerated
    inputs = regenerate_inputs(run, backend.name)
    inputs_hash = config_hash(inputs)
    manifest = Manifest(run.paths.run_dir)
    batch = run.config.regenerate.concurrency
    share = share_folder(folder, part)
    whole = manifest.is_current("regenerate", inputs_hash) and (folder / RESPONSES_FILE).is_file()
    if whole:
        source = read_source(folder)
        start, stop = share_span(len(source), batch, part)
        share.mkdir(parents=True, exist_ok=True)
        _slice_whole(folder, share, {row["id"] for row in source[start:stop]})
        status, counts = "skipped: unchanged", (manifest.record("regenerate") or {}).get("counts", {})
    else:
        status = f"part {part[0]} of {part[1]}"
        with manifest.recorded("regenerate", inputs_hash, inputs) as outcome:
            source_counts = build_source(run)
            source = read_source(folder)
            start, stop = share_span(len(source), batch, part)
            subset = source[start:stop]
            share.mkdir(parents=True, exist_ok=True)
            print(f"regenerate: share {part[0]} of {part[1]}: conversations {start}..{stop - 1} of {len(source)} "
                  f"with the {backend.name} backend", file=sys.stderr, flush=True)
            backend.answer(run, share, source, span=(start, stop))
            checked = check(share, subset)
            counts = outcome.counts = counts_of(checked, source_counts)
            if checked["problems"] or (subset and checked["rows"] == 0) or checked["missing"]:
                why = "; ".join(checked["problems"]) or f"{checked['missing']} conversations have no answer"
                raise CheckFailed(f"regenerate --part {part[0]}/{part[1]}: {share / RESPONSES_FILE}: {why}")
            outcome.status = status
    return {"step": "regenerate", "status": status, "backend": backend.name, "inputs_hash": inputs_hash,
            "counts": counts, "part": {"index": part[0], "count": part[1], "rows": [start, stop],
                                       "source": len(source)},
            "share": {"responses": str(share / RESPONSES_FILE), "errors": str(share / ERRORS_FILE)},
            "output": str(folder / RESPONSES_FILE), "errors_output": str(folder / ERRORS_FILE)}


def require_whole(run: Run, backend: str) -> StepReport:
    """Check the merged answers cover every conversation (exit 1 naming what is missing), then record
    regenerate done with its one-host inputs hash (`backend`: its name, one of the inputs); writes no answers."""
    from specops.pipeline.regenerate.inputs import regenerate_inputs
    from specops.pipeline.regenerate.output import RESPONSES_FILE, check, counts_of
    from specops.pipeline.regenerate.source import build_source, read_source
    from specops.pipeline.run import Manifest, config_hash

    folder = run.paths.regenerated
    inputs = regenerate_inputs(run, backend)
    inputs_hash = config_hash(inputs)
    manifest = Manifest(run.paths.run_dir)
    if manifest.inputs_hash("regenerate") != inputs_hash:
        # recording would otherwise remove answers it has no record of
        raise CheckFailed(f"regenerate --require-whole: {manifest.path}: this host answered no share of these "
                          "inputs (run `step regenerate --part I/COUNT` first)")
    source_counts = build_source(run)
    source = read_source(folder)
    checked = check(folder, source)
    path = folder / RESPONSES_FILE
    if checked["problems"]:
        raise CheckFailed(f"regenerate --require-whole: {path}: {'; '.join(checked['problems'])}")
    if checked["missing"] or checked["rows"] == 0:
        shown = ", ".join(checked["missing_list"][:5]) or "every one"
        raise CheckFailed(f"regenerate --require-whole: {path}: {checked['missing'] or len(source)} of "
                          f"{len(source)} conversations have no answer (e.g. {shown})")
    counts = {**counts_of(checked, source_counts), "answered": len(source), "complete": True}
    if not manifest.is_current("regenerate", inputs_hash):
        with manifest.recorded("regenerate", inputs_hash, inputs) as outcome:
            outcome.counts = counts
    return {"step": "regenerate", "status": "done: whole", "backend": backend, "inputs_hash": inputs_hash,
            "counts": counts, "failed": checked["failed_list"], "output": str(path)}


def join_shares(folder: Path, count: int) -> dict[str, int]:
    """The answers of every share, joined in share order (= source order) into the run's own files;
    errors first: the responses file marks the answers written."""
    from specops.pipeline.regenerate.output import ERRORS_FILE, RESPONSES_FILE

    lines: dict[str, int] = {}
    for name in (ERRORS_FILE, RESPONSES_FILE):
        pieces = []
        for index in range(count):
            path = share_folder(folder, (index, count)) / name
            data = path.read_bytes() if path.is_file() else b""  # no errors file when nothing failed
            if data and not data.endswith(b"\n"):
                raise CheckFailed(f"regenerate across hosts: {path}: its last line is cut")
            pieces.append(data)
        joined = b"".join(pieces)
        atomic.write_bytes(folder / name, joined)
        lines[name] = joined.count(b"\n")
    return lines


def across_hosts(context: StepContext, backend: Backend) -> StepReport:
    """Share `rank` of `count` answered here; every share onto every host (the engine's exchange);
    joined; checked whole and recorded done with the one-host inputs hash, so prepare finds it current."""
    from specops.pipeline.regenerate.output import ERRORS_FILE, RESPONSES_FILE

    run, hosts = context.run, context.hosts
    part = (hosts.rank, hosts.count)
    report = regenerate_share(run, backend, part)
    plans = hosts.all_gather("regenerate-plan", {"inputs_hash": report["inputs_hash"],
                                                 "conversations": report["part"]["source"],
                                                 "status": report["status"], "rows": report["part"]["rows"]})
    shares_fit("regenerate", plans, hosts.names, "conversations", "target, data or sampling settings")
    shares = {name: {"rows": plan["rows"], "status": plan["status"]} for name, plan in zip(hosts.names, plans,
                                                                                             strict=True)}
    if all(plan["status"] == "skipped: unchanged" for plan in plans):
        return {**report, "status": "skipped: unchanged", "shares": shares, "exchanged": None}
    folder = run.paths.regenerated
    mine = [str((share_folder(folder, part) / name).relative_to(folder)) for name in (ERRORS_FILE, RESPONSES_FILE)
            if (share_folder(folder, part) / name).is_file()]
    exchanged = hosts.exchange("regenerate", folder, mine, lacking=True)
    joined = join_shares(folder, hosts.count)
    whole = require_whole(run, backend.name)
    return {**whole, "shares": shares, "joined": joined, "exchanged": exchanged}
