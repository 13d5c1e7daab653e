"""The target model: which device and dtype it computes in, loading it, its dimensions and its
decoder parts. The hf extraction, the vLLM server's dtype and the fidelity check all decide here,
so the two backends and the check compute in the same dtype on the same host."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput

if TYPE_CHECKING:  # run configs need pydantic, which the bench's bare GPU image may lack
    from specops.pipeline.run import Run


def dtype_name(dtype_setting: str, on_gpu: bool) -> str:
    """The dtype the target computes in: bf16 on GPUs, fp32 on CPUs, unless the run says otherwise (the
    rule lives in planning: the plan and the doctor project hidden-state bytes in the same dtype)."""
    from specops.planning import hidden_state_dtype

    return hidden_state_dtype(dtype_setting, on_gpu)


def choose_device(dtype_setting: str) -> tuple[Any, Any]:
    """(torch device, torch dtype) for an in-process forward: the GPU when there is one."""
    import torch

    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    return device, getattr(torch, dtype_name(dtype_setting, on_gpu))


def target_class_name(run: Run) -> str:
    """The transformers class that loads the target: the model's own remote code when it ships one for
    causal LM and the run trusts it, else the model_type's generating class from transformers' auto
    mappings — a multimodal wrapper's own class, never AutoModelForCausalLM, which refuses it. Decided by
    specops.analysis.target_load, the same function the doctor's judgement reads."""
    from specops.analysis import target_load
    from specops.pipeline.run import read_model_config

    found = target_load(read_model_config(run.model_path), run.config.trust_remote_code)
    if found is None:
        raise BadInput("transformers is not installed in this env: it cannot load the target")
    if found.problem is not None or found.class_name is None:
        raise BadInput(f"{run.model_path / 'config.json'}: {found.problem}")
    return found.class_name


def load_target(run: Run, device: Any, dtype: Any) -> Any:
    import transformers

    model_class = getattr(transformers, target_class_name(run))
    model = model_class.from_pretrained(str(run.model_path), dtype=dtype,
                                        trust_remote_code=run.config.trust_remote_code)
    return model.to(device).eval()


def repeatable_attention(device: Any) -> Any:
    """A context in which the same batch generates the same tokens on every run: on CUDA, SDPA without its cuDNN
    backend. Measured on an H100 (torch 2.11, bench/regenerate_determinism.py, gpu-kimi's text model, 128 rows
    left-padded, 48 greedy tokens): with cuDNN attention 7-15 of 128 rows differ between two identical runs,
    torch.use_deterministic_algorithms(True) included and unwarned; with the memory-efficient or math backend
    0, at the same speed. Elsewhere: nothing changes."""
    import contextlib

    if getattr(device, "type", str(device)) != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def left_padded(prompts: list[list[int]], pad: int) -> tuple[Any, Any]:
    """(input ids, attention mask) of prompts left-padded to one width: every prompt ends at the
    same column, so a batched generate continues each as it would alone."""
    import torch

    width = max(len(prompt) for prompt in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return ids, mask


def hidden_size(run: Run) -> int:
    from specops.pipeline.run import read_model_config, text_config

    return int(text_config(read_model_config(run.model_path))["hidden_size"])


def decoder_parts(model: Any) -> tuple[Any, Any, Any]:
    """(decoder, its layer list, its final norm) of a causal LM, multimodal wrappers included."""
    candidates = [model]
    for name in ("model", "language_model", "text_model"):
        for holder in list(candidates):
            inner = getattr(holder, name, None)
            if inner is not None and inner not in candidates:
                candidates.append(inner)
    if hasattr(model, "get_decoder"):
        candidates.insert(0, model.get_decoder())
    for decoder in candidates:
        layers, norm = getattr(decoder, "layers", None), getattr(decoder, "norm", None)
        if layers is not None and norm is not None and hasattr(layers, "__len__"):
            return decoder, layers, norm
    raise BadInput(f"model: cannot find decoder layers and a final norm in {type(model).__name__}")
