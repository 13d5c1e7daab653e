"""What the plan knows of a target from its files alone: config.json and the safetensors headers.

Parameters are counted per part from the config (dense Llama-style, generic MoE, DeepSeek-V3's MLA
and MoE layout, multimodal wrappers through their text_config). The weights' size on disk and in
memory is their stored size: the shards' safetensors headers when the shards are here (every
tensor's dtype and byte range, quantised packs and scales included), else the index's total_size,
else the parameter count at the dtypes the config's quantization_config gives each part.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# bytes per element by torch dtype name, and by safetensors' dtype code
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
               "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
                     "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
EXPERT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
HEADER_LIMIT = 100 * 1024 * 1024  # safetensors' own cap on a header


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's keys: a multimodal wrapper's text_config over the wrapper's own."""
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, dict) else config


def _int(text: dict[str, Any], *keys: str, default: int = 0) -> int:
    for key in keys:
        value = text.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return default


@dataclass(frozen=True)
class Part:
    """Parameters of one kind of linear or embedding, under a representative module name (what a
    quantization_config's targets and ignore patterns are matched against)."""

    name: str
    params: int
    linear: bool = True


@dataclass
class TargetFacts:
    architecture: str | None
    layout: str                # "dense", "moe" or "mla-moe"
    layers: int
    hidden: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int          # the dense MLP's width (what speculators gives the draft)
    dtype: str                 # the unquantised weights' dtype (config torch_dtype / dtype)
    params: int
    parts: list[Part] = field(default_factory=list)
    experts: int | None = None
    experts_per_token: int | None = None
    moe_intermediate: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    weight_bytes: int = 0
    weight_source: str = ""
    weight_dtypes: dict[str, int] = field(default_factory=dict)  # bytes per stored dtype
    quantization: str | None = None

    def kv_bytes_per_token(self, kv_dtype_bytes: int) -> int:
        """The KV cache one token costs over all layers, on the whole model (before any split):
        MLA caches one compressed latent and the rope key per layer, others a key and a value per KV head."""
        if self.kv_lora_rank is not None:
            return (self.kv_lora_rank + (self.qk_rope_head_dim or 0)) * self.layers * kv_dtype_bytes
        return 2 * self.kv_heads * self.head_dim * self.layers * kv_dtype_bytes

    def memory_bytes(self, compute_dtype: str) -> dict[str, int]:
        """The weights' bytes once loaded, per loader: transformers decompresses a quantized checkpoint's weights
        to the dtype it computes in (on load or at the first forward; fp8 without a GPU dequantizes), vLLM keeps
        them as stored; an unquantized target is its parameters at the compute dtype in both."""
        dequantized = self.params * DTYPE_BYTES.get(compute_dtype, 2)
        return {"transformers": dequantized, "vllm": self.weight_bytes if self.quantization else dequantized}

    def to_dict(self) -> dict[str, Any]:
        return {"architecture": self.architecture, "layout": self.layout, "layers": self.layers,
                "hidden": self.hidden, "vocab": self.vocab, "heads": self.heads, "kv_heads": self.kv_heads,
                "head_dim": self.head_dim, "intermediate": self.intermediate, "dtype": self.dtype,
                "params": self.params, "experts": self.experts, "experts_per_token": self.experts_per_token,
                "moe_intermediate": self.moe_intermediate, "kv_lora_rank": self.kv_lora_rank,
                "qk_rope_head_dim": self.qk_rope_head_dim, "weight_bytes": self.weight_bytes,
                "weight_source": self.weight_source, "weight_dtypes": self.weight_dtypes,
                "quantization": self.quantization}


def _parts(text: dict[str, Any]) -> tuple[str, list[Part]]:
    """(layout, parts) of a decoder-only model, counted from its config."""
    hidden, layers = _int(text, "hidden_size"), _int(text, "num_hidden_layers")
    vocab, heads = _int(text, "vocab_size"), _int(text, "num_attention_heads", default=1)
    kv_heads = _int(text, "num_key_value_heads", default=heads)
    head_dim = _int(text, "head_dim", default=hidden // max(heads, 1))
    intermediate = _int(text, "intermediate_size")
    experts = _int(text, *EXPERT_KEYS)
    moe_intermediate = _int(text, "moe_intermediate_size", default=intermediate)
    parts = [Part("model.embed_tokens", vocab * hidden, linear=False)]
    norms = hidden  # the final norm
    mla = _int(text, "kv_lora_rank") > 0
    layer_kinds: list[str] = []
    dense_first = _int(text, "first_k_dense_replace")
    every = _int(text, "moe_layer_freq", default=1) or 1
    # DeepSeek-V3's multi-token-prediction layers are stored in the checkpoint after the last layer
    extra = _int(text, "num_nextn_predict_layers")
    for index in range(layers + extra):
        moe = experts > 0 and index >= dense_first and index % every == 0
        layer_kinds.append("moe" if moe else "dense")
    attention: list[Part] = []
    if mla:
        q_rank, kv_rank = _int(text, "q_lora_rank"), _int(text, "kv_lora_rank")
        nope, rope, value = (_int(text, "qk_nope_head_dim"), _int(text, "qk_rope_head_dim"),
                             _int(text, "v_head_dim"))
        query = heads * (nope + rope)
        if q_rank:
            attention += [Part("self_attn.q_a_proj", hidden * q_rank), Part("self_attn.q_b_proj", q_rank * query)]
            norms_per_layer = q_rank + kv_rank
        else:
            attention.append(Part("self_attn.q_proj", hidden * query))
            norms_per_layer = kv_rank
        attention += [Part("self_attn.kv_a_proj_with_mqa", hidden * (kv_rank + rope)),
                      Part("self_attn.kv_b_proj", kv_rank * heads * (nope + value)),
                      Part("self_attn.o_proj", heads * value * hidden)]
    else:
        attention = [Part("self_attn.q_proj", hidden * heads * head_dim),
                     Part("self_attn.k_proj", hidden * kv_heads * head_dim),
                     Part("self_attn.v_proj", hidden * kv_heads * head_dim),
                     Part("self_attn.o_proj", heads * head_dim * hidden)]
        norms_per_layer = 0
    shared = _int(text, "n_shared_experts", "shared_expert_count")
    shared_width = _int(text, "shared_expert_intermediate_size", default=moe_intermediate * max(shared, 1))
    for index, kind in enumerate(layer_kinds):
        prefix = f"model.layers.{index}."
        parts += [Part(prefix + part.name, part.params) for part in attention]
        norms += 2 * hidden + norms_per_layer
        if kind == "dense":
            parts += [Part(f"{prefix}mlp.{name}_proj", hidden * intermediate) for name in ("gate", "up", "down")]
            continue
        parts.append(Part(prefix + "mlp.gate", hidden * experts, linear=False))  # the router: no nn.Linear
        parts += [Part(f"{prefix}mlp.experts.0.{name}_proj", experts * hidden * moe_intermediate)
                  for name in ("gate", "up", "down")]
        if shared:
            parts += [Part(f"{prefix}mlp.shared_experts.{name}_proj", hidden * shared_width)
                      for name in ("gate", "up", "down")]
        if text.get("topk_method") == "noaux_tc":
            norms += experts  # the router's correction bias
        if index >= layers:  # a prediction layer's own parts
            parts.append(Part(prefix + "eh_proj", 2 * hidden * hidden))
            norms += 3 * hidden
    if not text.get("tie_word_embeddings", False):
        parts.append(Part("lm_head", vocab * hidden))
    parts.append(Part("model.norms", norms, linear=False))
    layout = "mla-moe" if mla and experts else "moe" if experts else "dense"
    return layout, parts


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return name == pattern or name.endswith("." + pattern)


def _quantised_bytes(text: dict[str, Any], parts: list[Part], dtype_bytes: int) -> tuple[int, str | None]:
    """Stored bytes of the parts under the config's quantization_config, and its name (None: none)."""
    quant = text.get("quantization_config")
    if not isinstance(quant, dict):
        return sum(part.params for part in parts) * dtype_bytes, None
    method = str(quant.get("quant_method") or quant.get("format") or "quantised")
    ignore = [str(p) for p in quant.get("ignore") or quant.get("modules_to_not_convert") or []]
    groups = quant.get("config_groups")
    if isinstance(groups, dict) and groups:  # compressed-tensors
        weights = next(iter(groups.values())).get("weights") or {}
        bits = int(weights.get("num_bits") or 16)
        group = int(weights.get("group_size") or 0)
        scale = 2 / group if group else 0.0  # one bf16 scale per group (a zero point too if asymmetric)
        if group and weights.get("symmetric") is False:
            scale *= 2
        per_param, label = bits / 8 + scale, f"{method} int{bits}" + (f" g{group}" if group else "")
    elif method == "fp8":
        block = quant.get("weight_block_size") or [128, 128]
        per_param, label = 1 + 4 / (int(block[0]) * int(block[1])), "fp8"
        ignore = ignore or ["lm_head"]
    else:
        return sum(part.params for part in parts) * dtype_bytes, method
    total = 0.0
    for part in parts:
        quantised = part.linear and not any(_matches(part.name, pattern) for pattern in ignore)
        total += part.params * (per_param if quantised else dtype_bytes)
    return int(total), label


def safetensors_header(file: Path) -> dict | None:
    """A safetensors file's JSON header (8 bytes little-endian length, then JSON), read without the tensors;
    None for what is not one (short, oversized, unreadable or not a JSON object)."""
    try:
        with file.open("rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                return None
            (length,) = struct.unpack("<Q", head)
            if length > HEADER_LIMIT:
                return None
            header = json.loads(handle.read(length))
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) else None


def read_headers(model_dir: Path) -> dict[str, int] | None:
    """Bytes per stored dtype over every *.safetensors shard's header; None without shards."""
    shards = sorted(model_dir.glob("*.safetensors")) if model_dir.is_dir() else []
    if not shards:
        return None
    found: dict[str, int] = {}
    for shard in shards:
        header = safetensors_header(shard)
        if header is None:
            return None
        for name, entry in header.items():
            if name == "__metadata__" or not isinstance(entry, dict):
                continue
            start, end = entry.get("data_offsets", (0, 0))
            found[str(entry.get("dtype"))] = found.get(str(entry.get("dtype")), 0) + int(end) - int(start)
    return found


def _draft_head_dim(config: dict[str, Any], text: dict[str, Any]) -> int:
    """The head_dim speculators reads off the target's config object: config.json's, else what the class
    sets. transformers' own DeepseekV3Config sets qk_rope_head_dim; a remote-code config (Kimi's kimi_k2,
    auto_map) sets none, and the draft splits hidden over the heads."""
    heads = _int(text, "num_attention_heads", default=1)
    if text.get("model_type") == "deepseek_v3" and "auto_map" not in config and _int(text, "qk_rope_head_dim"):
        return _int(text, "head_dim", default=_int(text, "qk_rope_head_dim"))
    return _int(text, "head_dim", default=_int(text, "hidden_size") // max(heads, 1))


def read_target(model_dir: Path, config: dict[str, Any] | None = None) -> TargetFacts:
    """The target's facts from `model_dir` (config.json, shards or index); `config` given: no config read."""
    if config is None:
        config = json.loads((model_dir / "config.json").read_text())
    text = text_config(config)
    layout, parts = _parts(text)
    dtype = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16")
    dtype_bytes = DTYPE_BYTES.get(dtype, 2)
    heads = _int(text, "num_attention_heads", default=1)
    hidden = _int(text, "hidden_size")
    facts = TargetFacts(
        architecture=(config.get("architectures") or [None])[0], layout=layout,
        layers=_int(text, "num_hidden_layers"), hidden=hidden, vocab=_int(text, "vocab_size"), heads=heads,
        kv_heads=_int(text, "num_key_value_heads", default=heads),
        head_dim=_draft_head_dim(config, text),
        intermediate=_int(text, "intermediate_size", default=3 * hidden), dtype=dtype,
        params=sum(part.params for part in parts), parts=parts,
        experts=_int(text, *EXPERT_KEYS) or None, experts_per_token=_int(text, "num_experts_per_tok") or None,
        moe_intermediate=_int(text, "moe_intermediate_size") or None,
        kv_lora_rank=_int(text, "kv_lora_rank") or None, qk_rope_head_dim=_int(text, "qk_rope_head_dim") or None)
    stored, quantisation = _quantised_bytes(text, parts, dtype_bytes)
    facts.quantization = quantisation
    headers = read_headers(model_dir)
    if headers:
        facts.weight_bytes, facts.weight_dtypes = sum(headers.values()), headers
        facts.weight_source = "safetensors headers"
        return facts
    try:
        total = json.loads((model_dir / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
        if isinstance(total, int) and total > 0:
            facts.weight_bytes, facts.weight_source = total, "safetensors index total_size"
            return facts
    except (OSError, ValueError, KeyError, TypeError):
        pass
    facts.weight_bytes = stored
    facts.weight_source = f"config: parameters at {dtype}" + (f", quantised parts as {quantisation}"
                                                                if quantisation else "")
    return facts
