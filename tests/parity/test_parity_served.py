"""The parity gate's one real request: the untrained draft that `speculators train --dry-run` writes, served by
a real vLLM CPU server as the target's EAGLE-3 speculator. The server drafts, and the auxiliary layers its own
log says it captures are the ones the gate read statically from vLLM's source and the ones extraction captured.

A server of its own (the draft in --speculative-config): the session's shared server serves the extraction
config, and replacing it would cost every later module of the serve worker a restart.
"""

from __future__ import annotations

import pytest

from tests.support.agent import run_agent as agent
from tests.support.finished import copy_of
from tests.support.vllm import VLLM_PYTHON, free_port, in_vllm_worker, needs_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm, in_vllm_worker]

AUX = "eagle_aux_hidden_state_layer_ids"


def test_one_request_with_the_untrained_draft_serves_the_layers_training_used(finished, patched_vllm,
                                                                              tmp_path) -> None:
    root = copy_of(finished, tmp_path / "w")
    config = root / "runs" / "tiny.yaml"
    config.write_text(config.read_text().replace("port: 8000", f"port: {free_port()}"))
    env = {"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON), "VLLM_CPU_KVCACHE_SPACE": "1"}

    code, document, stderr = agent(root, "step", "parity", "--run", "tiny", "--serve", env=env, timeout=900)

    assert code == 0, stderr[-4000:]
    served = document["served"]
    assert served["ok"] and served["num_drafts"] > 0 and served["text"]
    rows = {row["key"]: row for row in document["rows"]}
    assert served["logged_aux_layers"] == rows[AUX]["serving"] == rows[AUX]["training"] == [1, 2, 3]
    assert served["vllm_version"] == document["vllm"] == "0.32.0"
    code, jobs, _ = agent(root, "job", "list")  # stopped afterwards: training needs the host
    assert code == 0 and not [job for job in jobs["jobs"] if job.get("state") == "running"]
