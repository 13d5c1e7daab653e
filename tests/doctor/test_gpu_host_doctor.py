"""The doctor judges a GPU host by vLLM's CUDA build, with no false alarm (issue 57): SmolLM2-135M's shape (the real
target the GPU runs serve) against vLLM 0.33.0's CUDA wheel (its Python files), on a host with one GPU. Measured on
an H100 with 0.26.0: FLASH_ATTN chosen, the extraction server on Model Runner V1, the target served and extracted;
so the serving, capability and draft checks must hold no error here."""

from __future__ import annotations

import json
from pathlib import Path

from testing.agent import run_agent
from testing.wheels import python_with

SMOLLM2 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576,
           "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536,
           "vocab_size": 49152, "max_position_embeddings": 8192, "tie_word_embeddings": True,
           "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5, "rope_theta": 100000.0}


def test_a_gpu_host_with_vllms_cuda_build_gets_no_error_for_a_dense_bf16_target(tmp_path: Path) -> None:
    model = tmp_path / "smollm2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(SMOLLM2))
    serve = python_with(tmp_path / "serve", ("vllm", "0.33.0"))
    settings = {"model_path": str(model), "backend": "vllm", "gpus": 1, "dtype": "bfloat16",
                "serve_python": str(serve), "serve_flags": ["--max-model-len", "1025"]}
    code, document, stderr = run_agent(tmp_path, "doctor", "--no-import", "--checks", "serving,capability,draft",
                                       "--run-json", json.dumps(settings))
    errors = [f"{f['where']}: {f['why']}" for f in document["findings"] if f["result"] == "error"]
    assert errors == [] and code == 0, (errors, stderr[-2000:])
    assert document["versions"]["vllm"] == "0.33.0"
    judged = {f["check"] for f in document["findings"]}
    assert {"serving", "draft"} <= judged  # the checks ran: their rows are there, not skipped
