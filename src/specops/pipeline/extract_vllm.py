"""Step 2 with the `vllm` backend, client side: speculators' `generate-offline-data` against a ready server.

The server (vllm_server.build_serve_command, behind vllm_server.wait_ready) computes the hidden
states; this side sends it the prepared rows and keeps the run's books:

1. step 1 (prepare) runs first when its outputs are missing or stale: the prepared folder is the
   speculators 0.9 `prepare-data` format, which `generate-offline-data` reads as it is;
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
from dataclasses import dataclass
from typing import Any

from specops import atomic
from specops.errors import BadInput, CheckFailed
from specops.pipeline.config import Run, config_hash
from specops.pipeline.fingerprint import model_digest
from specops.pipeline.hidden_states import file_for, remove_temporaries, verify_header
from specops.pipeline.runs import visible_gpus

DEFAULT_CONCURRENCY = 8
DEFAULT_REQUEST_TIMEOUT_S = 600
# speculators' closing line: "Timing: 1.1s elapsed, 9.2 samples/s, avg vLLM request 350 ms, ..."
_TIMING = re.compile(r"Timing: ([0-9.]+)s elapsed, ([0-9.]+) samples/s")


def extract_inputs(run: Run, prepare_hash: str, dtype: str) -> dict[str, Any]:
    """What the files depend on (the manifest's skip decision); the server's address is not part of it."""
    return {"prepare": prepare_hash, "model": run.config.model, "model_digest": model_digest(run.model_path),
            "layer_ids": run.layer_ids(), "dtype": dtype, "backend": "vllm"}


def generate_offline_argv(run: Run, endpoint: str, count: int, *, concurrency: int = DEFAULT_CONCURRENCY,
                          request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                          python: str | None = None) -> list[str]:
    """The speculators command line for rows 0..count-1 of the run's prepared data."""
    return [python or sys.executable, "-m", "speculators", "generate-offline-data",
            "--endpoint", endpoint, "--preprocessed-data", str(run.paths.prepared),
            "--output", str(run.paths.hidden_states), "--max-samples", str(count),
            "--concurrency", str(concurrency), "--request-timeout", str(request_timeout_s),
            "--validate-outputs", "--fail-on-error"]


def _check_files(run: Run, lengths: list[int], count: int, n_layers: int, hidden: int,
                 dtype: str) -> dict[int, str]:
    problems = {}
    for index in range(count):
        problem = verify_header(file_for(run.paths.hidden_states, index), lengths[index], n_layers, hidden, dtype)
        if problem is not None:
            problems[index] = problem
    return problems


@dataclass
class ExtractionPlan:
    """What is on disk against what the run asks for: decided once, before any server is needed."""

    manifest: Any
    inputs: dict[str, Any]
    inputs_hash: str
    dtype: str
    lengths: list[int]
    count: int
    layer_ids: list[int]
    hidden: int
    folder: Any
    current: bool  # the recorded extract inputs are these
    problems: dict[int, str]  # files of rows 0..count-1 that are missing or not whole (when current)

    @property
    def unchanged(self) -> bool:
        return (self.current and not self.problems and self.manifest.is_current("extract", self.inputs_hash)
                and self.manifest.record("extract").get("counts", {}).get("samples", 0) >= self.count)


def plan_extraction(run: Run, samples: int | None, host_gpus: int) -> ExtractionPlan:
    """Prepare if needed, then compare the run's extraction inputs and files with what is there."""
    import datasets

    from specops.pipeline.extract_hf import hidden_size
    from specops.pipeline.manifest import Manifest
    from specops.pipeline.prepare import prepare
    from specops.pipeline.vllm_server import serve_dtype

    prepared = prepare(run, None, strict=False)
    dtype = serve_dtype(run, host_gpus)
    lengths = list(datasets.load_from_disk(str(run.paths.prepared)).with_format(None)["seq_len"])
    count = min(samples or run.config.samples or len(lengths), len(lengths))
    inputs = extract_inputs(run, prepared["inputs_hash"], dtype)
    inputs_hash = config_hash(inputs)
    folder, hidden = run.paths.hidden_states, hidden_size(run)
    manifest = Manifest(run.paths.run_dir)
    current = manifest.inputs_hash("extract") == inputs_hash
    problems: dict[int, str] = {}
    if current:
        remove_temporaries(folder)
        problems = _check_files(run, lengths, count, len(inputs["layer_ids"]), hidden, dtype)
    return ExtractionPlan(manifest, inputs, inputs_hash, dtype, lengths, count, inputs["layer_ids"], hidden,
                          folder, current, problems)


def run_generate_offline(run: Run, endpoint: str, samples: int | None, *, host_gpus: int | None = None,
                         concurrency: int = DEFAULT_CONCURRENCY,
                         request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S) -> dict[str, Any]:
    """Extract hidden states of prepared rows 0..N-1 through a ready extraction server.

    run        the loaded run; step 1 (prepare) runs first if its outputs are missing or stale
    endpoint   the server's OpenAI base URL, e.g. "http://127.0.0.1:8000/v1"; the server must be
               the run's (model and layer ids; see vllm_server.build_serve_command) and ready
               (vllm_server.wait_ready)
    samples    N; None: the run's `samples`, else every prepared row (capped at the rows prepared)
    host_gpus  GPUs of the host, which decide the dtype the server was started with (as in
               build_serve_command); default: the host's NVIDIA device nodes
    concurrency, request_timeout_s  passed to speculators (--concurrency, --request-timeout)

    Returns the step report {"step": "extract", "status": "done" | "skipped: unchanged", "counts",
    "inputs_hash", "layer_ids", "dtype", "seconds", "samples_per_s", "tokens_per_s", "output",
    "backend": "vllm"}. Raises CheckFailed (exit 1) when speculators fails or a file is not whole.
    """
    plan = plan_extraction(run, samples, visible_gpus() if host_gpus is None else host_gpus)
    if plan.unchanged:
        return {"step": "extract", "status": "skipped: unchanged", "backend": "vllm",
                "inputs_hash": plan.inputs_hash, "counts": plan.manifest.record("extract")["counts"]}
    manifest, inputs, inputs_hash, current, problems = (plan.manifest, plan.inputs, plan.inputs_hash,
                                                       plan.current, plan.problems)
    dtype, lengths, count, layer_ids, hidden = plan.dtype, plan.lengths, plan.count, plan.layer_ids, plan.hidden
    folder = plan.folder

    started = manifest.begin("extract", inputs_hash, inputs)  # other inputs: old files are removed
    folder.mkdir(parents=True, exist_ok=True)
    if not current:
        problems = {index: "missing" for index in range(count)}
    regenerated = {index: why for index, why in problems.items() if why != "missing"}
    for index, why in regenerated.items():
        print(f"extract: hs_{index}.safetensors is not whole ({why}); regenerating", file=sys.stderr)
        file_for(folder, index).unlink(missing_ok=True)
    todo = sorted(problems)
    tokens = sum(lengths[i] for i in todo)

    argv = generate_offline_argv(run, endpoint, count, concurrency=concurrency,
                                 request_timeout_s=request_timeout_s)
    print(f"extract: {len(todo)} of {count} samples through {endpoint}", file=sys.stderr, flush=True)
    clock = time.monotonic()
    timing: dict[str, float] = {}
    if todo:
        code, timing = _run_speculators(argv)
        if code != 0:
            manifest.finish("extract", started, {"samples": 0}, status="failed")
            raise CheckFailed(f"speculators generate-offline-data exited {code} "
                              f"(endpoint {endpoint}); see its output above")
    elapsed = max(time.monotonic() - clock, 1e-9)
    problems = _check_files(run, lengths, count, len(layer_ids), hidden, dtype)
    if problems:
        manifest.finish("extract", started, {"samples": 0}, status="failed")
        listed = ", ".join(f"hs_{i}: {why}" for i, why in list(problems.items())[:5])
        raise CheckFailed(f"{len(problems)} of {count} hidden-state files are not as expected: {listed}")
    atomic.fsync_dir(folder)
    written = sum(file_for(folder, i).stat().st_size for i in todo)
    rates = {"samples_per_s": round(len(todo) / elapsed, 3), "tokens_per_s": round(tokens / elapsed, 1),
             "write_mb_per_s": round(written / elapsed / 1e6, 2)}
    atomic.write_json(run.paths.progress, {"state": "done", "done": len(todo), "total": len(todo),
                                           "tokens_done": tokens, "tokens_total": tokens, "eta_s": 0,
                                           "elapsed_s": round(elapsed, 2), "updated_at": time.time(), **rates})
    counts = {"samples": count, "written": len(todo), "regenerated": len(regenerated),
              "tokens_written": tokens, "bytes_written": written}
    record = manifest.finish("extract", started, counts)
    return {"step": "extract", "status": "done", "backend": "vllm", "inputs_hash": inputs_hash, "counts": counts,
            "layer_ids": layer_ids, "dtype": dtype, "endpoint": endpoint, "seconds": record["seconds"],
            "extract_seconds": round(elapsed, 2), **rates, "speculators_timing": timing, "output": str(folder)}


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


def check_endpoint(endpoint: str) -> str:
    if not endpoint.startswith(("http://", "https://")):
        raise BadInput(f"--endpoint: {endpoint!r} is not an http(s) URL")
    return endpoint.rstrip("/")
