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
