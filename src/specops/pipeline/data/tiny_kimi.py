"""Embedded targets laid out like Kimi-K2.5: the user's own target at a size a CPU runs in seconds.

Shape "kimi" is the published checkpoint's layout: a multimodal wrapper (`model_type: kimi_k25`,
architecture `KimiK25ForConditionalGeneration`, a vision tower and projector) around a DeepSeek-V3 text
model (`text_config.model_type: kimi_k2`): MLA at the real 512 + 64 latent, routed experts behind the
`noaux_tc` router with its `e_score_correction_bias`, a dense first layer (`first_k_dense_replace`), a
model vocabulary larger than the tokenizer's, and a tokenizer that is remote code (`auto_map` to a
`tokenization_kimi.py` beside the weights, as the published one ships its own). Weights are saved under
the published names (`language_model.model.layers...`, per-expert `experts.N.gate_proj`), written
here rather than by `save_pretrained`, whose reversal of the wrapper's load-time renames writes the
text model's layers as `blocks` and its `q_proj` as the vision tower's `wqkv`.

Shape "kimi-text" is the text model alone (`DeepseekV3ForCausalLM`): the form vLLM's CPU build serves.
Shape "kimi-gpu" is the wrapper at real MLA width with Kimi's vocabulary (163,840) for a GPU host.
Shape "kimi-int4" is "kimi" stored as Kimi-K2.5 is published: its routed experts compressed-tensors int4
pack-quantized (symmetric groups of 32, `weight_packed`/`weight_scale`/`weight_shape`, packed by
compressed-tensors' own `pack_to_int32`), everything else left as it was (`ignore`: lm_head, attention, shared
experts, dense MLPs, and at this size the vision tower and projector, which Kimi's quantization never reaches).
Deterministic from fixed seeds; no download."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from specops.host.atomic import replace_folder

KIMI_SHAPES = ("kimi", "kimi-text", "kimi-gpu", "kimi-int4")
ARCHITECTURE = "KimiK25ForConditionalGeneration"  # the published name, the one vLLM's registry uses
TOKENIZER_CLASS = "TikTokenTokenizer"             # the published remote-code tokenizer's class name
TOKENIZER_MODULE = "tokenization_kimi"

# MLA at the published latent (kv_lora_rank 512 + qk_rope_head_dim 64 = 576, the only width vLLM's CPU
# MLA decode kernel takes), noaux_tc routing with sigmoid scores, one dense layer first.
_TEXT_COMMON: dict[str, Any] = dict(
    kv_lora_rank=512, qk_rope_head_dim=64, n_shared_experts=1, routed_scaling_factor=2.827,
    n_group=1, topk_group=1, norm_topk_prob=True, first_k_dense_replace=1, topk_method="noaux_tc",
    scoring_func="sigmoid", hidden_act="silu", rms_norm_eps=1e-5, max_position_embeddings=1024,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.02,
)
TEXT_DIMENSIONS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4,
                 num_attention_heads=2, num_key_value_heads=2, q_lora_rank=48, qk_nope_head_dim=32,
                 v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2),
    "gpu": dict(hidden_size=2048, intermediate_size=8192, moe_intermediate_size=1024, num_hidden_layers=8,
                num_attention_heads=16, num_key_value_heads=16, q_lora_rank=768, qk_nope_head_dim=128,
                v_head_dim=128, n_routed_experts=16, num_experts_per_tok=4),
}
TINY_EXTRA_VOCAB = 64     # the model's vocabulary exceeds the tokenizer's, as Kimi's 163,840 does
GPU_VOCAB = 163_840
VISION = dict(patch_size=14, pos_emb_height=4, pos_emb_width=4, pos_emb_time=1, num_attention_heads=2,
              num_hidden_layers=1, hidden_size=32, intermediate_size=64)

# The remote code the tokenizer's auto_map names: a fast tokenizer under the published class name.
# Its vocabulary is in a file only this class knows (as the published one reads tiktoken.model), so
# without trust_remote_code nothing can load it, as with the real one.
VOCAB_FILE = "tiktoken.json"
TOKENIZER_SOURCE = f'''"""The embedded Kimi-shaped target's tokenizer, loaded as remote code (trust_remote_code), as the
published checkpoint loads its own tokenization_kimi.py."""
from transformers import PreTrainedTokenizerFast


class {TOKENIZER_CLASS}(PreTrainedTokenizerFast):
    """A byte-level BPE tokenizer under the published class name, its vocabulary in {VOCAB_FILE}."""

    vocab_files_names = {{"vocab_file": "{VOCAB_FILE}"}}

    def __init__(self, vocab_file=None, **kwargs):
        kwargs.pop("tokenizer_file", None)
        super().__init__(tokenizer_file=vocab_file, **kwargs)
'''


def model_dir_for(shape: str) -> str:
    return {"kimi": "models/tiny-kimi-k25", "kimi-text": "models/tiny-kimi-text",
            "kimi-gpu": "models/random-kimi-k25", "kimi-int4": "models/tiny-kimi-k25-int4"}[shape]


# Kimi-K2.5's published quantization_config (config.json), its routed experts' int4 scheme
INT4_GROUP = 32
QUANTIZATION_CONFIG: dict[str, Any] = {
    "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
    "kv_cache_scheme": None,
    "config_groups": {"group_0": {
        "targets": ["Linear"], "input_activations": None, "output_activations": None,
        "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": INT4_GROUP,
                    "dynamic": False, "actorder": None, "block_structure": None, "observer": "minmax",
                    "observer_kwargs": {}}}},
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
               "re:.*vision_tower.*", "re:.*mm_projector.*"],
}
_ROUTED = re.compile(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")


def text_config(shape: str, vocab_size: int) -> dict[str, Any]:
    dims = TEXT_DIMENSIONS["gpu" if shape == "kimi-gpu" else "tiny"]
    return {**_TEXT_COMMON, **dims, "vocab_size": vocab_size}


def save(folder: Path, shape: str, tokenizer: Any, on_gpu: bool = False) -> None:
    """The model, its config and its remote-code tokenizer into folder (a staging folder)."""
    import torch

    vocab = vocab_for(shape, tokenizer)
    device = torch.device("cuda" if on_gpu else "cpu")
    model = _random_model(shape, vocab, device)
    if shape == "kimi-gpu":
        _silence_undecodable(model, len(tokenizer))
    state = _published_state(model, wrapped=shape != "kimi-text", folder=folder)
    packed = _pack_routed_experts(state) if shape == "kimi-int4" else {}
    _write_weights(folder, state, torch.bfloat16 if shape == "kimi-gpu" else torch.float32, keep=packed)
    _write_config(folder, model, shape)
    _write_tokenizer(folder, tokenizer)


def vocab_for(shape: str, tokenizer: Any) -> int:
    return GPU_VOCAB if shape == "kimi-gpu" else len(tokenizer) + TINY_EXTRA_VOCAB


def model_config(shape: str, vocab: int) -> Any:
    """The transformers config of the shape (no weights: `plan` reads it before anything is generated)."""
    from transformers import DeepseekV3Config, Kimi_K25Config

    text = text_config(shape, vocab)
    if shape == "kimi-text":
        return DeepseekV3Config(**text)
    return Kimi_K25Config(text_config={**text, "model_type": "kimi_k2"}, vision_config=dict(VISION),
                          projection_hidden_size=VISION["hidden_size"], tie_word_embeddings=False,
                          image_token_id=vocab - 4, vision_start_token_id=vocab - 3,
                          vision_end_token_id=vocab - 2, video_token_id=vocab - 1)


def published_config(config: Any, shape: str) -> dict[str, Any]:
    """config.json as the generated target's folder holds it."""
    document = config.to_dict()
    document["dtype"] = "bfloat16" if shape == "kimi-gpu" else "float32"
    if shape == "kimi-int4":
        document["quantization_config"] = json.loads(json.dumps(QUANTIZATION_CONFIG))
    if shape == "kimi-text":
        document["architectures"] = ["DeepseekV3ForCausalLM"]
    else:
        document["architectures"] = [ARCHITECTURE]
        document["text_config"]["model_type"] = "kimi_k2"   # as published; transformers reads it as deepseek_v3
        document["text_config"]["architectures"] = ["DeepseekV3ForCausalLM"]
    for key in ("transformers_version", "_name_or_path"):
        document.pop(key, None)
    return document


def _random_model(shape: str, vocab: int, device: Any) -> Any:
    """Random weights whose greedy answers a one-layer draft can learn: every matrix normal(0, 0.08) at
    tiny width (confident, not noise, like the tiny Llama); at GPU width 0.02, the embedding N(0, 1)
    and the residual writes scaled down (tiny.random_llama says why). The router's bias is random too,
    so a checkpoint without it answers differently."""
    import torch
    from transformers import DeepseekV3ForCausalLM, Kimi_K25ForConditionalGeneration

    text = text_config(shape, vocab)
    torch.manual_seed(1234)
    with torch.device(device):
        config = model_config(shape, vocab)
        if shape == "kimi-text":
            model = DeepseekV3ForCausalLM(config)
        else:
            model = Kimi_K25ForConditionalGeneration(config)
    model = model.float()
    gpu_width = shape == "kimi-gpu"
    generator = torch.Generator(device=device).manual_seed(1234)
    layers = text["num_hidden_layers"]
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # a buffer, not a parameter
                buffer.normal_(0.0, 0.5, generator=generator)
        for name, parameter in model.named_parameters():
            if parameter.dim() == 1:
                parameter.fill_(1.0) if "norm" in name else parameter.zero_()
            elif not gpu_width:
                parameter.normal_(0.0, 0.08, generator=generator)
            elif "embed_tokens" in name:
                parameter.normal_(0.0, 1.0, generator=generator)
            else:
                parameter.normal_(0.0, 0.02, generator=generator)
                if name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                    parameter.mul_((2 * layers) ** -0.5)
    return model.eval()


def _silence_undecodable(model: Any, decodable: int) -> None:
    """Zero the head's rows of the ids beyond the tokenizer's. With Kimi's 163,840 ids and the embedded
    512-token tokenizer, a random head put an undecodable id first at most positions: on the H200, 1,941
    of 2,358 regenerated answers came back empty and prepare kept 302 of the 2,000 rows asked. A zero
    row's logit (0) loses to the best of 512 random logits, as a trained model's padding rows lose; the
    tiny shapes (64 such ids of 576) never hit it and keep their bytes."""
    import torch

    with torch.no_grad():
        model.lm_head.weight[decodable:].zero_()


def _published_state(model: Any, wrapped: bool, folder: Path) -> dict[str, Any]:
    """The state dict under the published checkpoint's names: the text model under
    `language_model.model.` and its head `language_model.lm_head.` (wrapper) or `model.`/`lm_head.`
    (text model); fused experts split into one gate/up/down projection per expert. The vision tower and
    projector keep what transformers writes for them (their reversal is right)."""
    text_model = model.model.language_model if wrapped else model.model
    prefix = "language_model.model." if wrapped else "model."
    state: dict[str, Any] = {}
    for name, tensor in text_model.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj"):  # [experts, 2 x moe_intermediate, hidden]
            base = prefix + name[: -len("gate_up_proj")]
            for expert, fused in enumerate(tensor):
                gate, up = fused.chunk(2, dim=0)
                state[f"{base}{expert}.gate_proj.weight"] = gate
                state[f"{base}{expert}.up_proj.weight"] = up
        elif name.endswith("mlp.experts.down_proj"):   # [experts, hidden, moe_intermediate]
            base = prefix + name[: -len("down_proj")]
            for expert, weight in enumerate(tensor):
                state[f"{base}{expert}.down_proj.weight"] = weight
        elif "rotary_emb" not in name:
            state[prefix + name] = tensor
    state[("language_model." if wrapped else "") + "lm_head.weight"] = model.lm_head.weight
    if wrapped:
        state.update(_vision_state(model, folder))
    return state


def _vision_state(model: Any, folder: Path) -> dict[str, Any]:
    """The vision tower's and projector's tensors under the names transformers saves them with."""
    from safetensors.torch import load_file

    scratch = folder / ".vision"
    model.save_pretrained(scratch)
    saved: dict[str, Any] = {}
    for shard in sorted(scratch.glob("*.safetensors")):
        saved.update({name: tensor for name, tensor in load_file(shard).items()
                      if not name.startswith("language_model.")})
    for file in scratch.iterdir():
        file.unlink()
    scratch.rmdir()
    return saved


def _pack_routed_experts(state: dict[str, Any]) -> dict[str, Any]:
    """Each routed expert's projection as compressed-tensors stores an int4 symmetric group-quantized Linear:
    `weight_packed` (int32, 8 values a word), `weight_scale` (bf16, one per group of 32), `weight_shape` (int32);
    taken out of `state` and returned (stored as they are, not cast). Round to nearest, scale = max |w| / 7."""
    import torch

    try:
        from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    except ImportError as exc:  # the host env's set-up installs it (requirements/host.txt)
        raise SystemExit(f"tiny --shape kimi-int4: compressed-tensors is not installed in this env ({exc}): "
                         "pip install 'compressed-tensors>=0.15.0'") from None
    packed: dict[str, Any] = {}
    for name in sorted(n for n in state if _ROUTED.search(n)):
        weight = state.pop(name).detach().float().cpu()
        rows, cols = weight.shape
        groups = weight.reshape(rows, cols // INT4_GROUP, INT4_GROUP)
        scale = (groups.abs().amax(dim=-1) / 7).clamp(min=1e-8).to(torch.bfloat16)
        quantized = torch.round(groups / scale.float().unsqueeze(-1)).clamp(-8, 7).to(torch.int8).reshape(rows, cols)
        base = name[: -len("weight")]
        packed[base + "weight_packed"] = pack_to_int32(quantized, 4)
        packed[base + "weight_scale"] = scale.contiguous()
        packed[base + "weight_shape"] = torch.tensor([rows, cols], dtype=torch.int32)
    return packed


def _write_weights(folder: Path, state: dict[str, Any], dtype: Any, keep: dict[str, Any] | None = None) -> None:
    """One file at tiny size; shards of ~4 GB with an index at GPU size, as published checkpoints have.
    `keep`: tensors stored in their own dtype (quantized packs and scales)."""
    from safetensors.torch import save_file

    tensors = {name: tensor.detach().to(dtype).contiguous().cpu() for name, tensor in state.items()}
    tensors.update({name: tensor.contiguous().cpu() for name, tensor in (keep or {}).items()})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if total < 2**31:
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for name in sorted(tensors):
        bytes_ = tensors[name].numel() * tensors[name].element_size()
        if size + bytes_ > 4 * 2**30 and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += bytes_
    weight_map = {}
    for index, shard in enumerate(shards, start=1):
        file = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in shard})
    index_doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index_doc, indent=2, sort_keys=True) + "\n")


def _write_config(folder: Path, model: Any, shape: str) -> None:
    config = published_config(model.config, shape)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _write_tokenizer(folder: Path, tokenizer: Any) -> None:
    """The tiny tokenizer, reached through auto_map as remote code under the published class name."""
    tokenizer.save_pretrained(folder)
    (folder / "tokenizer.json").rename(folder / VOCAB_FILE)
    config_file = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text())
    tokenizer_config.update(chat_template=tokenizer.chat_template, tokenizer_class=TOKENIZER_CLASS,
                            auto_map={"AutoTokenizer": [f"{TOKENIZER_MODULE}.{TOKENIZER_CLASS}", None]})
    config_file.write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
    (folder / f"{TOKENIZER_MODULE}.py").write_text(TOKENIZER_SOURCE)


def generate(root: Path, shape: str, tokenizer: Any, on_gpu: bool = False) -> Path:
    model_dir = root / model_dir_for(shape)
    replace_folder(model_dir, lambda staging: save(staging, shape, tokenizer, on_gpu))
    return model_dir
