"""Which kernel makes the hf backend's batched greedy generation differ between two identical runs on a GPU.

Issue 42: `bench/gpu_pipeline.py --runs gpu-kimi` twice on one H100 gave 83 of 2,048 regenerated answers that
differ (same prompts, same batches, bf16), with `torch.use_deterministic_algorithms(True)` still 17. This
builds gpu-kimi's text model (DeepseekV3ForCausalLM: hidden 2048, 8 layers, MLA 512 + 64, 16 routed experts,
4 per token, noaux_tc; random weights, seed 0) and, side by side in one process, for each experts
implementation x attention implementation x deterministic mode:

- the same left-padded batch forwarded twice: every module's output compared bit for bit, the first that
  differs named (the kernel that is not run-to-run deterministic);
- greedy generation of the batch twice: how many rows' answers differ.

Run on a GPU: `python3 bench/regenerate_determinism.py [--batch 128] [--new-tokens 48]` (transformers with
DeepseekV3; no specops import, nothing downloaded). Prints one JSON line per configuration, then a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic cuBLAS asks for

import torch

TEXT = {"hidden_size": 2048, "intermediate_size": 4096, "moe_intermediate_size": 512, "num_hidden_layers": 8,
        "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512, "q_lora_rank": 768,
        "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 64, "n_routed_experts": 16,
        "num_experts_per_tok": 4, "n_shared_experts": 1, "first_k_dense_replace": 1, "topk_method": "noaux_tc",
        "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
        "vocab_size": 32768, "max_position_embeddings": 4096, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def build(experts: str, attention: str, device: str) -> torch.nn.Module:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    config = DeepseekV3Config(**TEXT, attn_implementation=attention)
    with torch.device(device):  # initialised where it runs: seconds, not minutes on the host's CPU
        model = DeepseekV3ForCausalLM(config).to(torch.bfloat16).eval()
    for layer in model.model.layers:  # the router's correction bias, as a trained checkpoint has it
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "e_score_correction_bias"):
            gate.e_score_correction_bias.data.normal_(0, 0.01)
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(experts)
    return model


def batch(size: int, device: str, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, 160, (size,), generator=generator)
    ids = torch.zeros(size, int(lengths.max()), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths.tolist()):  # left-padded, as the hf regenerate backend pads
        ids[row, -length:] = torch.randint(3, TEXT["vocab_size"], (length,), generator=generator)
        mask[row, -length:] = 1
    return ids.to(device), mask.to(device)


def first_difference(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> dict:
    """Forward twice; the first module (in call order) whose output is not bit-identical."""
    outputs: list[dict[str, torch.Tensor]] = [{}, {}]
    order: list[str] = []
    run = [0]

    def hook(name: str):
        def save(_module, _inputs, output):
            tensor = output[0] if isinstance(output, tuple) else output
            if isinstance(tensor, torch.Tensor):
                outputs[run[0]][name] = tensor.detach().clone()
                if run[0] == 0:
                    order.append(name)
        return save

    handles = [module.register_forward_hook(hook(name)) for name, module in model.named_modules() if name]
    with torch.no_grad():
        for run[0] in (0, 1):
            model(input_ids=ids, attention_mask=mask)
    for handle in handles:
        handle.remove()
    for name in order:
        a, b = outputs[0][name], outputs[1].get(name)
        if b is None or a.shape != b.shape or not torch.equal(a, b):
            diff = (a.float() - b.float()).abs().max().item() if b is not None and a.shape == b.shape else None
            return {"first_differing_module": name, "max_abs_diff": diff}
    return {"first_differing_module": None}


def generations_differ(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int) -> int:
    answers = []
    with torch.no_grad():
        for _ in range(2):
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=0, eos_token_id=2)
            answers.append(out[:, ids.shape[1]:].cpu())
    return int((answers[0] != answers[1]).any(dim=1).sum())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--experts", default="eager,batched_mm,grouped_mm")
    parser.add_argument("--attention", default="sdpa,eager")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sdpa-backends", default="", help="comma list of torch SDPBackend names to allow "
                        "(e.g. MATH, EFFICIENT_ATTENTION, CUDNN_ATTENTION); default: torch's choice")
    args = parser.parse_args()
    import transformers

    print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                      "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"}), flush=True)
    ids, mask = batch(args.batch, args.device)
    summary = []
    for experts in args.experts.split(","):
        for attention in args.attention.split(","):
            for deterministic in (False, True):
                torch.use_deterministic_algorithms(deterministic, warn_only=True)
                began = time.perf_counter()
                model = None
                try:
                    model = build(experts, attention, args.device)
                    from contextlib import nullcontext

                    from torch.nn.attention import SDPBackend, sdpa_kernel

                    allowed = [getattr(SDPBackend, name) for name in args.sdpa_backends.split(",") if name]
                    with sdpa_kernel(allowed) if allowed else nullcontext():
                        row = {"experts": experts, "attention": attention, "deterministic": deterministic,
                               "sdpa_backends": args.sdpa_backends or "torch's choice",
                               **first_difference(model, ids, mask),
                               "rows_differing": generations_differ(model, ids, mask, args.new_tokens),
                               "of": args.batch}
                except Exception as exc:  # an implementation this transformers lacks: said, the rest goes on
                    row = {"experts": experts, "attention": attention, "deterministic": deterministic,
                           "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                row["seconds"] = round(time.perf_counter() - began, 1)
                print(json.dumps(row), flush=True)
                summary.append(row)
                del model
                if args.device == "cuda":
                    torch.cuda.empty_cache()
    print(json.dumps({"summary": [(r["experts"], r["attention"], r["deterministic"], r.get("rows_differing"),
                                   r.get("first_differing_module")) for r in summary]}))


if __name__ == "__main__":
    main()
