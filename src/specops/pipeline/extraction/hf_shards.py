"""The hf backend on several GPUs: one process per GPU, each running its own whole batches.

The one-process batch plan (hf.plan_batches) is cut into contiguous runs of batches
(specops.planning.row_ranges over the batch list), one run per process; every batch is formed
exactly as one process would form it, so each row's file holds the same bytes whichever process
wrote it. The parent writes the cut to `<run>/extract-shards.json`, starts
`python -m specops step extract-shard --run R --shard I` per GPU (CUDA_VISIBLE_DEVICES=I), sums
their progress files into the run's progress, and stops them all when one fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract import commandline
from specops.contract.errors import CheckFailed
from specops.host import atomic
from specops.planning import row_ranges

if TYPE_CHECKING:
    from specops.pipeline.extraction.plan import ExtractionPlan
    from specops.pipeline.run import Run

SHARDS_FILE = "extract-shards.json"
POLL_S = 0.5


def split_batches(batches: list[list[int]], parts: int) -> list[list[list[int]]]:
    """Contiguous runs of whole batches, one per process (some empty when there are few batches)."""
    return [batches[start:stop] for start, stop in row_ranges(len(batches), parts)]


def host_share(plan: ExtractionPlan, batches: list[list[int]],
               part: tuple[int, int]) -> tuple[dict[str, Any], set[int]]:
    """Share I of COUNT hosts: (its report, its rows): the rows of its contiguous run of whole batches
    of the one-host plan (a share is mostly whole windows of rows: a few spans even for 100k rows)."""
    index, total = part
    rows = {row for batch in split_batches(batches, total)[index] for row in batch}
    return plan.share(part, rows), rows


def shard_progress_file(run: Run, shard: int) -> Path:
    return run.paths.run_dir / f"progress-shard-{shard}.json"


def run_shards(run: Run, batches: list[list[int]], todo: set[int], layer_ids: list[int], hidden: int,
               processes: int, on_gpu: bool, progress: Any, batch_tokens: int) -> list[dict[str, Any]]:
    """Write the cut, run one process per shard, fold their progress into `progress` (hf.Progress); each
    shard's report. The shards are `step extract-shard` processes (hf.extract_shard)."""
    shards = split_batches(batches, processes)
    plan = {"shards": shards, "todo": sorted(todo), "layer_ids": layer_ids, "hidden": hidden,
            "batch_tokens": batch_tokens}
    atomic.write_json(run.paths.run_dir / SHARDS_FILE, plan)
    children: list[subprocess.Popen[bytes]] = []
    for index in range(len(shards)):
        shard_progress_file(run, index).unlink(missing_ok=True)
        env = dict(os.environ)
        if on_gpu:
            env["CUDA_VISIBLE_DEVICES"] = str(index)  # each process sees its one GPU as cuda:0
        argv = [sys.executable, "-m", "specops", *commandline.step_extract_shard(run=run.paths.name, shard=index)]
        children.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL))
    progress.start()
    try:
        while any(child.poll() is None for child in children):
            failed = [index for index, child in enumerate(children) if child.poll() not in (None, 0)]
            if failed:
                raise CheckFailed(f"extract: shard {failed[0]} exited {children[failed[0]].returncode}; "
                                  "the other shards were stopped")
            _fold_progress(run, len(shards), progress)
            time.sleep(POLL_S)
        reports = []
        for index, child in enumerate(children):
            out = child.stdout.read() if child.stdout else b""
            if child.returncode != 0:
                raise CheckFailed(f"extract: shard {index} exited {child.returncode}")
            reports.append(json.loads(out.decode().strip().splitlines()[-1]))
        _fold_progress(run, len(shards), progress)
        return reports
    finally:
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            child.wait()


def _fold_progress(run: Run, shards: int, progress: Any) -> None:
    done = tokens = written = 0
    for index in range(shards):
        try:
            document = json.loads(shard_progress_file(run, index).read_text())
        except (OSError, ValueError):
            continue
        done += document.get("done", 0)
        tokens += document.get("tokens_done", 0)
        written += document.get("written_bytes", 0)
    progress.done_samples, progress.done_tokens = done, tokens
    progress.written_bytes = max(progress.written_bytes, written)
    progress.report()
