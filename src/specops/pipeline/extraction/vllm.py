"""The extract step with the `vllm` backend: the run's `vllm-server` job, then speculators' `generate-offline-data`.

`extract_with_server` touches no server when the plan says there is nothing to do; otherwise it
has the vllm room find or launch the run's server job and wait until it is ready, then the client
here sends it the prepared rows and keeps the run's books:

1. prepare's rows are read (the step table ran prepare first; missing is one line naming it): the
   prepared folder is the speculators 0.9 `prepare-data` format, which `generate-offline-data` reads as it is;
2. files of rows 0..N-1 already on disk are kept when the manifest says they come from the same
   inputs and their headers are whole; any other file is removed, so speculators regenerates it
   (speculators itself only regenerates files that safetensors cannot open);
3. `python -m speculators generate-offline-data --endpoint E --preprocessed-data <prepared>
   --output <hidden_states> --max-samples N --validate-outputs --fail-on-error` runs in this
   interpreter's env (speculators 0.9 talks HTTP to the server and never imports vLLM, so the client
   needs no vLLM and the serve env needs no speculators); its output goes to stderr (the job log);
4. every file 0..N-1 must then have the expected header (token count, layer count, hidden size,
   dtype); the manifest's extract record is written as the hf backend writes it, so
   `step validate` (files and fidelity) and later steps read it the same way.

The files are those the hf backend writes (hs_{i}.safetensors: token_ids int64 [seq],
hidden_states [seq, n_layers, hidden]) with the same layer convention: id i < n is the state
entering decoder layer i, id n the residual stream before the final norm.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import Any

from specops.contract.errors import CheckFailed
from specops.host import atomic, gpus
from specops.pipeline import vllm
from specops.pipeline.extraction.hidden_states import file_for
from specops.pipeline.extraction.plan import (
    ExtractionPlan,
    backend_input,
    plan_extraction,
    prepared_rows,
    rows_to_extract,
)
from specops.pipeline.run import ExtractCounts, Run, StepReport, model_digest
from specops.planning import row_ranges

DEFAULT_REQUEST_TIMEOUT_S = 600
# speculators' closing line: "Timing: 1.1s elapsed, 9.2 samples/s, avg vLLM request 350 ms, ..."
_TIMING = re.compile(r"Timing: ([0-9.]+)s elapsed, ([0-9.]+) samples/s")


def extract_inputs(run: Run, prepare_hash: str, dtype: str) -> dict[str, Any]:
    """What the files depend on (the manifest's skip decision); the server's address is not part of it."""
    return {"prepare": prepare_hash, "model": run.config.model, "model_digest": model_digest(run.model_path),
            "layer_ids": run.layer_ids(), "dtype": dtype, "backend": "vllm", **backend_input(run)}


def generate_offline_argv(run: Run, endpoint: str, count: int, *, concurrency: int | None = None,
                          request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                          python: str | None = None, part: tuple[int, int] | None = None) -> list[str]:
    """The speculators command line for rows 0..count-1 of the run's prepared data; with `part` (I, COUNT)
    only share I of them (speculators' --rank I --world-size COUNT: the rows of row_ranges(count, COUNT)[I]).
    `concurrency`: requests in flight (default: the run's hidden_states.concurrency)."""
    shares = ["--world-size", str(part[1]), "--rank", str(part[0])] if part else []
    if concurrency is None:
        concurrency = run.config.hidden_states.concurrency
    return [python or sys.executable, "-m", "speculators", "generate-offline-data", *shares,
            "--endpoint", endpoint, "--preprocessed-data", str(run.paths.prepared),
            "--output", str(run.paths.hidden_states), "--max-samples", str(count),
            "--concurrency", str(concurrency), "--request-timeout", str(request_timeout_s),
            # speculators 0.9.0 checks a moved file with load_file and torch.aminmax, undequantised: on an fp8
            # file that raises ("aminmax_cpu" not implemented for 'Float8_e4m3fn'); the validate step reads fp8
            # files dequantised instead
            *([] if run.config.hidden_states.backend == "fp8" else ["--validate-outputs"]), "--fail-on-error"]


def plan_for(run: Run, samples: int | None, host_gpus: int) -> ExtractionPlan:
    """Prepare's rows (prepared_rows: read, never made here) against the run's extraction inputs and files."""
    prepare_hash, lengths = prepared_rows(run, samples)
    inputs = extract_inputs(run, prepare_hash, vllm.serve_dtype(run, host_gpus))
    return plan_extraction(run, lengths, rows_to_extract(run, lengths, inputs["dtype"], host_gpus), inputs)


def vllm_share(plan: ExtractionPlan, part: tuple[int, int]) -> tuple[dict[str, Any], set[int]]:
    """Share I of COUNT hosts, as speculators cuts rows 0..N-1 by rank: contiguous, the first ones one longer."""
    start, stop = row_ranges(plan.count, part[1])[part[0]]
    rows = set(range(start, stop))
    return plan.share(part, rows), rows


def run_generate_offline(run: Run, endpoint: str | None, samples: int | None, *, host_gpus: int | None = None,
                         concurrency: int | None = None,
                         request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S, part: tuple[int, int] | None = None,
                         require_whole: bool = False, plan: ExtractionPlan | None = None) -> StepReport:
    """Extract hidden states of prepared rows 0..N-1 through a ready extraction server.

    run        the loaded run; prepare's rows are read (the steps before extract ran: `step extract`,
               `vllm extract` and the pipeline run them)
    endpoint   the server's OpenAI base URL, e.g. "http://127.0.0.1:8000/v1"; the server must be
               the run's (model and layer ids; see vllm.build_serve_command) and ready
               (vllm.wait_ready)
    samples    N (the run's default applied by the caller); None: every row prepare wrote
    host_gpus  GPUs of the host, which decide the dtype the server was started with (as in
               build_serve_command); default: the host's NVIDIA device nodes
    concurrency, request_timeout_s  passed to speculators (--concurrency, default the run's
               hidden_states.concurrency; --request-timeout)
    part       (I, COUNT): write only share I of COUNT hosts (recorded as a part, not done)
    require_whole  write nothing (no endpoint needed): exit 1 unless every file 0..N-1 is whole, then
               record the step done (the check on every host after a gather)
    plan       the plan the caller already made for these arguments (extract_with_server: made to
               decide whether a server is needed; nothing else writes the files meanwhile)

    Returns the step report {"step": "extract", "status": "done" | "skipped: unchanged", "counts",
    "inputs_hash", "layer_ids", "dtype", "seconds", "samples_per_s", "tokens_per_s", "output",
    "backend": "vllm"}. Raises CheckFailed (exit 1) when speculators fails or a file is not whole.
    """
    if plan is None:
        plan = plan_for(run, samples, gpus.device_count() if host_gpus is None else host_gpus)
    if require_whole:
        plan.require_all_whole()
    share, share_rows = vllm_share(plan, part) if part else (None, None)
    if plan.unchanged:
        return {**plan.skipped(), "backend": "vllm", **({"part": share} if share else {})}
    inputs_hash, count, folder = plan.inputs_hash, plan.count, plan.folder
    with plan.recorded() as (outcome, todo):
        outcome.counts = ExtractCounts(samples=0)  # what a failure below is recorded with
        if share_rows is not None:
            todo = [row for row in todo if row in share_rows]
        tokens = sum(plan.lengths[i] for i in todo)
        if todo and endpoint is None:
            raise CheckFailed(f"extract: {len(todo)} files to write and no server to write them")

        argv = generate_offline_argv(run, endpoint or "", count, concurrency=concurrency,
                                     request_timeout_s=request_timeout_s, part=part)
        print(f"extract: {len(todo)} of {count} samples through {endpoint or 'no server (all whole)'}",
              file=sys.stderr, flush=True)
        clock = time.monotonic()
        timing: dict[str, float] = {}
        if todo:
            code, timing = _run_speculators(argv)
            if code != 0:
                raise CheckFailed(f"speculators generate-offline-data exited {code} "
                                  f"(endpoint {endpoint}); see its output above")
        elapsed = max(time.monotonic() - clock, 1e-9)
        problems = plan.check_written(share_rows)
        if problems:
            listed = ", ".join(f"hs_{i}: {why}" for i, why in list(problems.items())[:5])
            raise CheckFailed(f"{len(problems)} of {count} hidden-state files are not as expected: {listed}")
        atomic.fsync_dir(folder)
        written = sum(file_for(folder, i).stat().st_size for i in todo)
        rates = {"samples_per_s": round(len(todo) / elapsed, 3), "tokens_per_s": round(tokens / elapsed, 1),
                 "write_mb_per_s": round(written / elapsed / 1e6, 2)}
        atomic.write_json(run.paths.progress, {"state": "done", "done": len(todo), "total": len(todo),
                                               "tokens_done": tokens, "tokens_total": tokens, "eta_s": 0,
                                               "elapsed_s": round(elapsed, 2), "updated_at": time.time(), **rates})
        # "samples": rows 0..count-1 are now whole on disk (a part: this host's share of them)
        counts = ExtractCounts(samples=share["rows"] if share else count, written=len(todo),
                               regenerated=len(plan.regenerated), tokens_written=tokens, bytes_written=written)
        status = f"part {share['index']} of {share['count']}" if share else "done"
        outcome.counts, outcome.status = counts, status
    return {"step": "extract", "status": status, "backend": "vllm", "inputs_hash": inputs_hash, "counts": counts,
            "layer_ids": plan.layer_ids, "dtype": plan.dtype, "endpoint": endpoint,
            "seconds": outcome.record["seconds"], "extract_seconds": round(elapsed, 2), **rates,
            "speculators_timing": timing, "output": str(folder), **({"part": share} if share else {})}


def _run_speculators(argv: list[str]) -> tuple[int, dict[str, float]]:
    """Run speculators, its output copied to stderr (the job log; stdout carries one JSON document).

    Returns (exit code, {"requests_seconds", "samples_per_s"} from speculators' timing line: the
    rate of the requests alone, without the client's start-up of ~20 s).
    """
    env = {**os.environ, "COLUMNS": "400"}  # rich would wrap its log lines at 80 columns
    timing: dict[str, float] = {}
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          env=env) as process:
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.decode(errors="replace")
            sys.stderr.write(line)
            found = _TIMING.search(line)
            if found:
                timing = {"requests_seconds": float(found.group(1)), "samples_per_s": float(found.group(2))}
        sys.stderr.flush()
    return process.returncode, timing


def extract_with_server(run: Run, samples: int | None, *, stop_server: bool = False,
                        serve_python: str | os.PathLike[str] | None = None, ready_timeout_s: float = 1800.0,
                        port: int | None = None, part: tuple[int, int] | None = None,
                        require_whole: bool = False) -> StepReport:
    """Extract rows 0..N-1 with the vllm backend through this run's `vllm-server` job (reused or launched).

    run              the loaded run (its embedded model, if any, already generated)
    samples          N; None: the run's `samples`, else every prepared row
    stop_server      stop the server job at once afterwards, even where vllm.keep_server keeps it (without it,
                     the command's end stops it unless the run keeps it: vllm.serving)
    serve_python     the serve env's interpreter (default: $SPECOPS_SERVE_PYTHON, else this one)
    ready_timeout_s  how long the server may take to load before the step fails
    port             where the server listens (default: the run's vllm.port)
    part, require_whole  one host's share / the check after a gather (see run_generate_offline);
                     the check needs no server

    Nothing to do (rows 0..N-1 are extracted from the same inputs, and their files are whole): no
    server is touched at all. Returns run_generate_offline's report (status, counts, layer_ids,
    backend "vllm", seconds, ...) plus "server": {job, reused, port, ready_s, stopped, ...}. Raises
    CheckFailed with the server's log tail when it dies or does not get ready, BadInput for a
    missing serve env.
    """
    started = time.monotonic()
    host_gpus = gpus.device_count()
    if require_whole:
        return run_generate_offline(run, None, samples, host_gpus=host_gpus, require_whole=True)
    plan = plan_for(run, samples, host_gpus)
    if part:
        _, rows = vllm_share(plan, part)
        if all(row not in rows for row in plan.problems) and plan.current:
            # this host's share is whole already: record it without a server
            return run_generate_offline(run, None, samples, host_gpus=host_gpus, part=part, plan=plan)
    if plan.unchanged:
        print("extract: hidden states of these samples are already extracted from the same inputs; "
              "no server needed", file=sys.stderr, flush=True)
        # asked not to leave a server behind: one may still run from an earlier extract
        stopped = vllm.stop_running(run, "--stop-server") if stop_server else None
        return {**plan.skipped(), "backend": "vllm", "layer_ids": run.layer_ids(),
                "server": {"stopped": stopped} if stopped else None}

    server = vllm.start_server_job(run, host_gpus, port=port, serve_python=serve_python,
                                   ready_timeout_s=ready_timeout_s)
    try:
        report = run_generate_offline(run, server.endpoint, samples, host_gpus=host_gpus, part=part, plan=plan)
        baseline = target_alone_speed(run, server)
    finally:
        stopped = server.stop("--stop-server") if stop_server else None
    report["server"] = server.describe(stopped)
    if baseline is not None:
        report["baseline"] = baseline
    report["total_seconds"] = round(time.monotonic() - started, 2)
    return report


def target_alone_speed(run: Run, server: vllm.ServerJob) -> dict[str, Any] | None:
    """Evaluation's baseline (the target alone, tokens/s) measured on this server while it is up, so that
    evaluate loads no server for it (vllm.baseline); None where evaluate will not serve (off, or hf)."""
    settings = run.config.evaluate
    if not settings.enabled or settings.backend == "hf" or not settings.heldout_prompts:
        return None
    from specops.pipeline.data import heldout, load_tokenizer, render_ids

    rows = heldout.read_prompts(run.paths.heldout)
    if not rows:
        return None
    tokenizer = load_tokenizer(run)  # the ids evaluation sends (evaluation.prompts.heldout_token_ids)
    prompts = [render_ids(tokenizer, row["messages"], generation_prompt=True) for row in rows]
    if vllm.baseline.recorded(run, prompts, settings.max_tokens, server.version):
        return None
    model = (server.ready.get("models") or [str(run.model_path)])[0]
    record = vllm.baseline.measure(run, server.endpoint.removesuffix("/v1"), model, prompts, settings.max_tokens,
                                   server.version, server.record["id"])
    print(f"extract: the target alone, for evaluation's speedup: {record['tokens_per_s']} tokens/s on "
          f"{record['prompts']} held-out prompts ({record['how']})", file=sys.stderr, flush=True)
    return record
