"""Kimi-K2.5's text model (DeepseekV3ForCausalLM: MLA at the 512 + 64 latent, noaux_tc experts) through the
vllm backend on the real vLLM CPU server, as far as this CPU build goes: regenerate and extraction through one
server (`extract_hidden_states` with MLA), validation (fidelity against the server's own next-token choices,
and against a transformers forward: the same function), vocab, training with the parity gate (vLLM's numbering
of DeepseekV2Model's captured states, the final layer among them), and evaluation. What the evaluation can use
depends on this machine's CPU, and the test asserts that what the run's settings predict from vLLM's files
before any step is what vLLM then does:
- without AMX vLLM's CPU build cannot serve the GQA EAGLE-3 draft beside the MLA target (`No common block size
  (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])`): said in one line before any step, the gate's served request
  skipped, the draft evaluated by the hf replay;
- with AMX the target gets AMX_MLA, which shares blocks with the draft but takes bfloat16 only: the run
  (`dtype: auto`) is served in bfloat16, said in one line, and the trained draft is evaluated by real vLLM."""

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
    serve_args = yaml.safe_load(config.read_text())["vllm"]["serve_args"]
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
    served_here = settings["attention"]["servable"]
    assert served_here is (host_has_amx() is True), settings["attention"]  # predicted from vLLM's files
    evaluated_by = "vllm" if served_here else "hf"
    assert (settings["backend"], settings["regenerate_backend"], settings["evaluate_backend"]) == (
        "vllm", "vllm", evaluated_by)
    said = [line for line in stderr.splitlines() if BREAK in line]
    if served_here:
        assert not said and settings["serve_dtype"] == "bfloat16", settings
        (dtype_line,) = [line for line in stderr.splitlines() if "takes only bfloat16" in line]
        assert stderr.index(dtype_line) < stderr.index("== regenerate")  # said before any step
    else:
        assert len(said) == 2 and "the draft is evaluated by the hf replay instead" in said[0], said
        assert stderr.index(said[0]) < stderr.index("== regenerate")  # said before any step
        assert settings["serve_dtype"] == "float32"

    run = root / "runs" / RUN
    steps = json.loads((run / "manifest.json").read_text())["steps"]
    assert steps["regenerate"]["inputs"]["backend"] == "vllm" and steps["extract"]["inputs"]["backend"] == "vllm"
    assert summary["servers"]["starts"] == 1  # regenerate and extract shared one server
    fidelity = json.loads((run / "validate_report.json").read_text())["checks"]["fidelity"]
    assert fidelity["ok"] and fidelity["detail"]["reference"] == "vllm", fidelity
    # the server's states are transformers' function too: vLLM's CPU rotary kernel turned MLA's strided query
    # and key by the wrong positions (0.77 against a transformers forward) until the server left it out
    code, against_hf, stderr_hf = run_agent(root, "step", "validate", "--run", RUN, "--reference", "hf", env=env,
                                            timeout=600)
    hf = against_hf["checks"]["fidelity"]
    assert hf["detail"]["reference"] == "hf", json.dumps(hf)[:2000] + stderr_hf[-2000:]
    if not served_here:  # a float32 server is transformers' float32 function; a bfloat16 one only near it
        assert code == 0 and hf["ok"], json.dumps(hf)[:2000] + stderr_hf[-2000:]

    parity = json.loads((run / "parity" / "before-training.json").read_text())
    assert parity["when"] == "before training"
    rows = {row["key"]: row for row in parity["rows"]}
    assert all(row["ok"] for row in rows.values()), [row for row in rows.values() if not row["ok"]]
    assert rows["auxiliary layer numbering"]["serving"] == "id i entering layer i"
    assert "DeepseekV2Model" in rows["auxiliary layer numbering"]["where"]
    assert rows["final layer captured"]["training"] == rows["final layer captured"]["serving"] == "id 4"
    if served_here:
        assert parity["served"]["ok"] is True, parity["served"]
    else:
        assert parity["served"]["ok"] is None and BREAK in parity["served"]["skipped"]

    evaluation = json.loads((run / "evaluation" / "report.json").read_text())
    report = evaluation["report"]
    assert report["backend"] == evaluated_by and report["mean_acceptance_length"] >= 1.0, report
    print(json.dumps({"seconds": {name: step.get("seconds") for name, step in summary["steps"].items()},
                      "total": summary["seconds"], "fidelity": fidelity["detail"]["agreement"],
                      "trained": report["mean_acceptance_length"], "evaluated_by": evaluated_by,
                      "untrained": evaluation["untrained"]["mean_acceptance_length"]}))
