"""`evaluate --sweep` with the vllm backend against real vLLM CPU servers (the demo's finished run, its best
checkpoint): two cells, k=1 and k=2, one server each plus the target alone; what a cell reports is what
its server counted on its own /metrics, and the speed columns are the two servers' tokens/s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from tests.evaluation.conftest import copy_of
from tests.support.agent import agent_env
from tests.support.runs import edit_run
from tests.support.vllm import spec_decode_total
from tests.vllm.conftest import VLLM_PYTHON, agent, free_port, in_vllm_worker, needs_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm, in_vllm_worker]

PROMPTS, MAX_TOKENS = 3, 16




def test_a_vllm_sweep_reports_what_each_server_counted(evaluated, patched_vllm, tmp_path) -> None:
    root = copy_of(evaluated, tmp_path / "w")
    port = free_port()
    config = root / "runs" / "tiny.yaml"
    config.write_text(config.read_text().replace("port: 8000", f"port: {port}")
                      .replace("  max_tokens: 64", f"  max_tokens: {MAX_TOKENS}"))
    edit_run(config, vllm={"keep_server": True})  # the last server stays for its /metrics, asked by the run
    env = {**agent_env(root), "SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON)}
    done = subprocess.run([sys.executable, "-m", "specops", "step", "evaluate", "--run", "tiny", "--backend", "vllm",
                           "--sweep", "num_speculative_tokens=1,2", "--prompts", str(PROMPTS)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=1500)
    try:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        document = json.loads(done.stdout.strip().splitlines()[-1])
        sweep = document["sweep"]
        # the last server (k=2) saw only its cell's requests: its totals are the cell's counts
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    finally:
        os.environ["SPECOPS_WORKDIR"] = str(root)
        code, stopped, _ = agent(root, "job", "stop", "vllm-server", "--run", "tiny")
        assert code == 0, stopped
    assert sweep["backend"] == "vllm" and sweep["prompts"] == PROMPTS and sweep["max_tokens"] == MAX_TOKENS
    one, two = sweep["cells"]
    assert (one["num_speculative_tokens"], two["num_speculative_tokens"]) == (1, 2)
    assert two["num_drafts"] == spec_decode_total(metrics, "num_drafts") > 0
    assert two["num_draft_tokens"] == spec_decode_total(metrics, "num_draft_tokens") == 2 * two["num_drafts"]
    assert two["num_accepted_tokens"] == spec_decode_total(metrics, "num_accepted_tokens")
    assert two["per_position_acceptance"] == [
        round(spec_decode_total(metrics, "num_accepted_tokens_per_pos", p) / two["num_drafts"], 4) for p in range(2)]
    for cell in (one, two):
        assert cell["counts_from"] == "metrics_deltas"
        if cell["per_request"] is not None:  # the responses' own sums, where this vLLM gives them, agree
            assert cell["per_request"]["num_accepted_tokens"] == cell["num_accepted_tokens"]
            assert cell["per_request"]["num_drafts"] == cell["num_drafts"]
        assert cell["tokens_per_s_spec"] > 0 and cell["tokens_per_s_base"] == sweep["base"][0]["tokens_per_s"] > 0
        assert cell["speedup"] == round(cell["tokens_per_s_spec"] / cell["tokens_per_s_base"], 3)
    assert len({server["job"] for server in sweep["servers"]}) == 3  # the target alone, then one server per k
    last = sweep["servers"][-1]["job"]  # kept, as the run asks, and named with how to stop it
    assert document["vllm_servers"]["keeper"]["server"] == last and document["vllm_servers"]["stopped"] is None
    assert f"vLLM server job {last} of run tiny stays up until stopped by hand" in done.stderr
