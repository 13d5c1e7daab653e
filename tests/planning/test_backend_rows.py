"""The plan per hidden-state backend (file, fp8, mooncake) x mode, for the published Kimi-K2.5 config (its real
config.json) with issue 40's figures: 20,000 rows x 4,096 tokens, one host of 8 GPUs x 95.6 GiB, 80 GB free disk.
Nothing fits there; the plan names the nearest things that do, each with its disk, loads and time."""

from __future__ import annotations

from pathlib import Path

import pytest

from specops.planning import GIB, HostFacts, RunFacts, make_plan, read_target

KIMI = Path(__file__).parent / "kimi-k2.5"
ROWS, TOKENS = 20_000, 20_000 * 4096


def kimi_plan(backend: str = "file", gpus: int = 8, disk_gb: int = 80):
    run = RunFacts(name="kimi-k25", layer_ids=[2, 30, 58, 61], hidden_state_dtype="bfloat16", samples=ROWS,
                   tokens=TOKENS, tokens_source="given", max_seq_len=4096, epochs=3, tensor_parallel=8,
                   hidden_state_backend=backend)
    host = HostFacts(gpus=gpus, gpu_memory_bytes=int(95.6 * GIB), disk_free_bytes=disk_gb * 10**9)
    return make_plan(read_target(KIMI), run, host)


@pytest.fixture(scope="module")
def plan():
    return kimi_plan()


def test_fp8_bytes_per_token_include_the_scales(plan) -> None:
    rows = {(row["backend"], row["mode"]): row for row in plan.rows}
    assert rows[("file", "offline")]["bytes_per_token"] == 4 * 7168 * 2 + 8 == 57_352
    assert rows[("fp8", "offline")]["bytes_per_token"] == 4 * 7168 * 1 + 4 + 8 == 28_684  # fp8, scale, id
    assert kimi_plan("fp8").figures["hidden_states"]["dtype"] == "float8_e4m3fn"


def test_every_backend_and_mode_has_its_row(plan) -> None:
    assert [(row["backend"], row["mode"]) for row in plan.rows] == [
        (backend, mode) for backend in ("file", "fp8", "mooncake") for mode in ("offline", "online", "hybrid")]
    for row in plan.rows:
        assert {"disk_bytes", "server_loads", "total_s", "fits", "problems"} <= set(row)
    rows = {(row["backend"], row["mode"]): row for row in plan.rows}
    assert 4.7e12 < rows[("file", "offline")]["disk_bytes"] < 4.75e12  # the 4.73 TB
    assert 2.35e12 < rows[("fp8", "offline")]["disk_bytes"] < 2.4e12
    assert "keeps no files" in rows[("mooncake", "offline")]["problems"][0]
    assert not any(row["fits"] for row in plan.rows)  # 73.4 GiB a GPU for the server beside the trainer


def test_what_would_fit_is_named(plan) -> None:
    changes = {alt["change"].split(":")[0]: alt for alt in plan.alternatives}
    most = [alt for alt in plan.alternatives if alt.get("samples")]
    assert {(alt["backend"], alt["samples"]) for alt in most} == {("file", 224), ("fp8", 447)}
    assert all(alt["fits"] and alt["disk_bytes"] <= 0.9 * 80e9 for alt in most)
    hosts = [alt for alt in plan.alternatives if alt.get("hosts")]
    assert {(alt["backend"], alt["hosts"]) for alt in hosts} == {("file", 91), ("fp8", 46), ("mooncake", 2)}
    assert "1 more host (train role)" in changes
    assert plan.recommended["mode"] is None
    assert plan.recommended["nearest"] == {**plan.recommended["nearest"], "backend": "fp8", "mode": "offline",
                                           "samples": 447, "server_loads": 1}


def test_a_run_that_fits_names_no_alternatives() -> None:
    plan = kimi_plan(disk_gb=6000)
    assert plan.modes["offline"]["fits"] and plan.alternatives == []
    assert plan.recommended["mode"] == "offline"


def test_the_shipped_kimi_run_is_the_plans_nearest() -> None:
    from specops.pipeline.run.config import load_run_config

    config = load_run_config(Path(__file__).parents[2] / "runs" / "kimi-k25.yaml")
    assert (config.hidden_states.backend, config.hidden_states.mode) == ("fp8", "offline")
    assert config.samples <= kimi_plan().recommended["nearest"]["samples"]
    assert config.layer_ids == [2, 30, 58, 61] and config.vllm.tensor_parallel == 8 and config.trust_remote_code
