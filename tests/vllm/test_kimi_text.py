"""Kimi-K2.5's text model (DeepseekV3ForCausalLM: MLA at the 512 + 64 latent, noaux_tc experts) through the
vllm backend on the real vLLM CPU server, as far as this CPU build goes: regenerate and extraction through one
server (`extract_hidden_states` with MLA), validation (fidelity against the server's own next-token choices,
and against a transformers forward: the same function), vocab, training with the parity gate (vLLM's numbering
of DeepseekV2Model's captured states, the final layer among them), and evaluation through the hf replay.

The run selects vLLM's reference MLA backend (`--attention-backend CPU_MLA`): on a CPU with AMX vLLM would take
AMX_MLA (bfloat16 only), so without it the server's backend, dtype and what it can serve would differ by machine;
with it they are the same on every CPU, and the test asserts that the backend the run's settings predict from
vLLM's files is the one the server logs. CPU_MLA cannot serve the GQA EAGLE-3 draft beside the MLA target (`No
common block size (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])`), which the settings say in one line before any
step; the gate's served request is skipped, said. (What AMX_MLA does is judged from vLLM's files for both CPU
kinds: tests/pipeline/test_settings.py, tests/doctor/test_serve_env.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from specops.doctor import host_has_amx
from tests.support.agent import REPO, run_agent
from tests.support.runs import edit_run
from tests.support.vllm import VLLM_PYTHON, free_port, in_vllm_worker, needs_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm, in_vllm_worker]

RUN = "tiny-kimi-text"
BREAK = "No common block size (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])"
TIMEOUT_S = 1500  # a server load (~60 s alone on 2 cores), regenerate, extract, fidelity, training, the replay


def _workdir(root: Path) -> Path:
    shutil.copytree(REPO / "runs", root / "runs")
    (root / "patches").symlink_to(REPO / "patches")  # the pipeline's first step applies the sets that fit
    config = root / "runs" / f"{RUN}.yaml"
    serve_args = [*yaml.safe_load(config.read_text())["vllm"]["serve_args"], "--attention-backend", "CPU_MLA"]
    edit_run(config, samples=24, vllm={"port": free_port(), "serve_args": serve_args},
             regenerate={"max_tokens": 24}, train={"epochs": 2},
             evaluate={"heldout_prompts": 4, "max_tokens": 16, "epoch_prompts": 0})
    return root


def test_the_text_model_runs_every_step_this_cpu_build_serves(patched_vllm: dict, tmp_path: Path) -> None:
    root = _workdir(tmp_path / "w")
    env = {"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON), "VLLM_CPU_KVCACHE_SPACE": "1"}
    code, summary, stderr = run_agent(root, "pipeline", "--run", RUN, env=env, timeout=TIMEOUT_S)
    assert code == 0 and summary["ok"], json.dumps(summary)[:3000] + stderr[-4000:]

    settings = summary["settings"]
    assert (settings["backend"], settings["regenerate_backend"], settings["evaluate_backend"]) == ("vllm", "vllm", "hf")
    assert settings["attention"]["target"]["name"] == "CPU_MLA" and settings["serve_dtype"] == "float32"
    assert host_has_amx() is not None  # the CPU flags were read: the prediction above holds for this machine's kind
    said = [line for line in stderr.splitlines() if BREAK in line]
    assert len(said) == 2 and "the draft is evaluated by the hf replay instead" in said[0], said
    assert stderr.index(said[0]) < stderr.index("== regenerate")  # said before any step

    run = root / "runs" / RUN
    steps = json.loads((run / "manifest.json").read_text())["steps"]
    assert steps["regenerate"]["inputs"]["backend"] == "vllm" and steps["extract"]["inputs"]["backend"] == "vllm"
    assert summary["servers"]["starts"] == 1  # regenerate and extract shared one server
    server_logs = "".join(log.read_text(errors="replace") for log in root.rglob("*.log"))
    assert "Using CPU_MLA backend" in server_logs  # what the settings predicted is what vLLM took
    fidelity = json.loads((run / "validate_report.json").read_text())["checks"]["fidelity"]
    assert fidelity["ok"] and fidelity["detail"]["reference"] == "vllm", fidelity
    # the server's states are transformers' function too: vLLM's CPU rotary kernel turned MLA's strided query
    # and key by the wrong positions (0.77 against a transformers forward) until the server left it out
    code, against_hf, stderr_hf = run_agent(root, "step", "validate", "--run", RUN, "--reference", "hf", env=env,
                                            timeout=600)
    hf = against_hf["checks"]["fidelity"]
    assert code == 0 and hf["ok"] and hf["detail"]["reference"] == "hf", json.dumps(hf)[:2000] + stderr_hf[-2000:]

    parity = json.loads((run / "parity" / "before-training.json").read_text())
    assert parity["when"] == "before training"
    rows = {row["key"]: row for row in parity["rows"]}
    assert all(row["ok"] for row in rows.values()), [row for row in rows.values() if not row["ok"]]
    assert rows["auxiliary layer numbering"]["serving"] == "id i entering layer i"
    assert "DeepseekV2Model" in rows["auxiliary layer numbering"]["where"]
    assert rows["final layer captured"]["training"] == rows["final layer captured"]["serving"] == "id 4"
    assert parity["served"]["ok"] is None and BREAK in parity["served"]["skipped"]

    evaluation = json.loads((run / "evaluation" / "report.json").read_text())
    report = evaluation["report"]
    assert report["backend"] == "hf" and report["mean_acceptance_length"] >= 1.0, report
    print(json.dumps({"seconds": {name: step.get("seconds") for name, step in summary["steps"].items()},
                      "total": summary["seconds"], "fidelity": fidelity["detail"]["agreement"],
                      "trained": report["mean_acceptance_length"],
                      "untrained": evaluation["untrained"]["mean_acceptance_length"]}))
