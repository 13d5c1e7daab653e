"""The extraction room (the extract step): hidden states of the prepared rows, one file per row.

One plan (plan.py: done / to redo / to do) and one backend interface; the backend is picked here,
in one place, for `step extract` and the pipeline alike:
- hf    an in-process transformers forward with captured layers (hf.py);
- vllm  the run's vLLM extraction server and speculators' generate-offline-data (vllm.py).
This face stays free of pydantic and torch at import: the bench's bare GPU image imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from specops.contract.errors import BadInput
from specops.pipeline.extraction.budget import budget_bytes, bytes_on_disk
from specops.pipeline.extraction.hidden_states import (
    BackgroundWriter,
    file_for,
    index_of,
    inputs_backend,
    read_sample,
    remove_temporaries,
    stored_dtype,
    verify_header,
    write_sample,
)
from specops.pipeline.extraction.plan import ExtractionPlan, plan_extraction

if TYPE_CHECKING:
    from specops.pipeline.run import Run, StepContext, StepReport

BACKENDS = ("hf", "vllm")


@dataclass(frozen=True)
class Options:
    """What a caller may ask of a backend beyond the rows; a backend refuses what it cannot honour."""

    batch_tokens: int | None = None  # hf: padded tokens per forward batch
    processes: int | None = None  # hf: processes sharing the batches (default: one per GPU, 1 on CPU)
    stop_server: bool = False  # vllm: stop the server job afterwards
    port: int | None = None  # vllm: the server's port (default: the run's vllm.port)
    part: tuple[int, int] | None = None  # (I, COUNT): write only share I of COUNT hosts (one host's)
    require_whole: bool = False  # refuse (exit 1) unless every file of rows 0..N-1 is already whole


class Backend(Protocol):
    name: str

    def extract(self, run: Run, samples: int | None, options: Options) -> StepReport:
        """Run (or resume, or skip) the extract step for rows 0..N-1; the step's report."""
        ...


class HfBackend:
    name = "hf"

    def extract(self, run: Run, samples: int | None, options: Options) -> StepReport:
        if options.stop_server or options.port:
            raise BadInput(f"--stop-server/--port: only for the vllm backend (run {run.paths.name} extracts with hf)")
        from specops.pipeline.extraction.hf import extract

        return extract(run, samples, options.batch_tokens, options.processes, part=options.part,
                       require_whole=options.require_whole)


class VllmBackend:
    name = "vllm"

    def extract(self, run: Run, samples: int | None, options: Options) -> StepReport:
        if options.processes:
            raise BadInput(f"--processes: only for the hf backend (run {run.paths.name} extracts with vllm, "
                           "whose data_parallel replicas share the work)")
        from specops.pipeline.extraction.vllm import extract_with_server

        return extract_with_server(run, samples, stop_server=options.stop_server, port=options.port,
                                   part=options.part, require_whole=options.require_whole)


def backend_for(name: str) -> Backend:
    """The backend of that name: the run's effective settings' backend (made where the engine was entered:
    --backend, else the run's `backend:`, else hf on a host without GPUs, vllm otherwise)."""
    if name == "hf":
        return HfBackend()
    if name == "vllm":
        return VllmBackend()
    raise BadInput(f"--backend: {name!r} is not one of {', '.join(BACKENDS)}")


def extract_shard(run: Run, shard: int) -> dict[str, Any]:
    """One process's share of a several-process hf extraction (started by the extract step)."""
    from specops.pipeline.extraction.hf import extract_shard as run_shard

    return run_shard(run, shard)


def check_endpoint(endpoint: str) -> str:
    """An extraction server's OpenAI base URL, without its trailing slash."""
    if not endpoint.startswith(("http://", "https://")):
        raise BadInput(f"--endpoint: {endpoint!r} is not an http(s) URL")
    return endpoint.rstrip("/")


def extract_through(run: Run, endpoint: str, samples: int | None, host_gpus: int | None = None,
                    part: tuple[int, int] | None = None, require_whole: bool = False) -> StepReport:
    """The extract step against a ready vLLM extraction server at `endpoint` (started by someone else); `part`
    and `require_whole` as for the extract step (one host's share; the check after a gather)."""
    from specops.pipeline.extraction.vllm import run_generate_offline

    return run_generate_offline(run, endpoint, samples, host_gpus=host_gpus, part=part, require_whole=require_whole)


def extract(run: Run, samples: int | None, backend: str, options: Options = Options()) -> StepReport:
    """The extract step with the chosen backend; the report names the backend. Online mode extracts nothing:
    the trainer asks the run's server for every row (hybrid writes the rows the disk budget holds)."""
    chosen = backend_for(backend)
    if run.config.hidden_states.mode == "online":
        return {"backend": chosen.name, "step": "extract", "status": ONLINE_SKIP, "counts": {"samples": 0}}
    return {"backend": chosen.name, **chosen.extract(run, samples, options)}


def pipeline_step(context: StepContext) -> StepReport:
    """The pipeline's extract: rows 0..N-1 with the run's backend; across hosts, a share each (across.py)."""
    if context.hosts.count > 1:
        from specops.pipeline.extraction.across import across_hosts

        report = across_hosts(context)
    else:
        report = extract(context.run, context.samples, context.backend)
    from specops.pipeline.run import shares_of

    return {**report, "figures": {"samples": report.get("counts", {}).get("samples"), "extract": shares_of(report)}}


ONLINE_SKIP = "skipped: hidden_states.mode is online (the trainer asks the run's server)"


__all__ = [
    "BACKENDS",
    "ONLINE_SKIP",
    "Backend",
    "BackgroundWriter",
    "ExtractionPlan",
    "HfBackend",
    "Options",
    "VllmBackend",
    "backend_for",
    "budget_bytes",
    "bytes_on_disk",
    "extract",
    "extract_shard",
    "file_for",
    "index_of",
    "inputs_backend",
    "pipeline_step",
    "plan_extraction",
    "read_sample",
    "remove_temporaries",
    "stored_dtype",
    "verify_header",
    "write_sample",
]

