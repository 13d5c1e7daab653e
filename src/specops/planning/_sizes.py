"""The arithmetic of a run's sizes: hidden-state files, the draft, the trainer's and the server's memory.

Plain numbers in, bytes out. The doctor's storage check and `plan` both compute here, so a projection
and a refusal never disagree with each other or with the files the extraction writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specops.planning._target import DTYPE_BYTES

GB = 10**9  # disk_budget_gb and the human figures are decimal, as disks are sold
GIB = 2**30
TOKEN_ID_BYTES = 8  # token_ids int64 [seq] beside the hidden states in every file
# A hs_<i>.safetensors header: 8 length bytes and the JSON of two tensors, padded (measured on the tiny
# run's 200 files: 160 each; longer shapes add a few)
FILE_HEADER_BYTES = 160
# Prepared rows on disk per token: input_ids int32 + loss_mask int64 (Arrow), seq_len per row aside
PREPARED_BYTES_PER_TOKEN = 12
# A training rank's memory beyond parameters, gradients, optimizer state and activations: CUDA context,
# compiled kernels, allocator cache, NCCL buffers. On the H200 at 8B dimensions (bench/plan_memory.py,
# 8192 and 16384 tokens a step) the trainer's memory extrapolated to zero tokens was 5.06 GiB above
# params + grads + optimizer; with 2 GiB the plan fell short of the trainer below ~6000 tokens a step.
TRAINER_RESERVE_BYTES = 5 * GIB
SERVER_RESERVE_BYTES = 4 * GIB   # vLLM's activation peak, CUDA graphs, the connector's buffers
ONLINE_SAMPLES_IN_FLIGHT = 32
# An epoch folder's configs, state files, headers and pickling (tiny run: 16-19 kB beyond the tensors)
CHECKPOINT_FILES_BYTES = 16 * 1024    # files the server has written and the trainer not yet read


def hidden_state_dtype(dtype_setting: str, on_gpu: bool) -> str:
    """The dtype the target computes (and its hidden states are written) in: bf16 on GPUs, fp32 on
    CPUs, unless the run says otherwise. The hf backend, the vLLM server and the plan all use this."""
    if on_gpu:
        return "float32" if dtype_setting == "float32" else "bfloat16"
    return "bfloat16" if dtype_setting == "bfloat16" else "float32"


FP8 = "float8_e4m3fn"  # hidden_states.backend fp8 stores the states so (speculators' hs_connectors)
FP8_SCALE_BYTES = 4  # ... with one float32 scale per token (hidden_states_scales [seq, 1, 1])
BACKENDS = ("file", "fp8", "mooncake")


def stored_dtype(dtype: str, backend: str) -> str:
    """The dtype of the hidden states as a backend keeps them: fp8 quantises, file and mooncake keep the model's."""
    return FP8 if backend == "fp8" else dtype


def hidden_state_bytes_per_token(layers: int, hidden: int, dtype: str) -> int:
    """The captured layers' states of one token: layers x hidden x dtype bytes (fp8: and its float32 scale)."""
    return layers * hidden * DTYPE_BYTES[dtype] + (FP8_SCALE_BYTES if dtype == FP8 else 0)


def hidden_state_file_bytes(tokens: int, files: int, layers: int, hidden: int, dtype: str) -> int:
    """What `files` hs_<i>.safetensors holding `tokens` tokens in all take on disk."""
    return tokens * (hidden_state_bytes_per_token(layers, hidden, dtype) + TOKEN_ID_BYTES) + files * FILE_HEADER_BYTES


def on_disk(mode: str, offline_bytes: int, budget_bytes: int | None, in_flight_bytes: int) -> int:
    """Hidden-state bytes on disk at most, by mode: offline all of them; online only the samples in
    flight between server and trainer; hybrid the budget's share plus those in flight."""
    if mode == "online":
        return in_flight_bytes
    if mode == "hybrid":
        if budget_bytes is None or budget_bytes >= offline_bytes:  # all of them fit: none is made online
            return offline_bytes
        return budget_bytes + in_flight_bytes
    return offline_bytes


@dataclass(frozen=True)
class DraftSize:
    """An EAGLE-3 draft as speculators 0.9 builds it (Eagle3DraftModel over a Llama decoder layer)."""

    trainable: int   # fc, decoder layers, final norm
    matrices: int    # the trainable 2-D weights (Muon's share under the default optimizer)
    frozen: int      # the target's embedding, lm_head and verifier_lm_head cut to the draft vocab, verifier norm

    hidden: int = 0
    draft_vocab: int = 0
    target_vocab: int = 0

    @property
    def params(self) -> int:
        return self.trainable + self.frozen

    def checkpoint_bytes(self, optimizer: str) -> int:
        """One epoch's folder: speculators saves weights and optimizer state in bf16, everything but the
        verifier's lm_head and norm, plus d2t (int64) and t2d (bool)."""
        saved = self.params - self.hidden * self.draft_vocab - self.hidden
        return (2 * saved + optimizer_bytes(self, optimizer) // 2 + 8 * self.draft_vocab + self.target_vocab
                + CHECKPOINT_FILES_BYTES)


def draft_size(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, target_vocab: int,
               draft_vocab: int, layers: int, aux_layers: int) -> DraftSize:
    """Parameters of the draft: a norm over the concatenated aux states (speculators 0.9's eagle3 default,
    norm_before_fc), fc (aux x H -> H), `layers` decoder layers (the first reads [embeds, hidden], 2H
    wide, into q/k/v and has a third norm), a final norm; frozen: embedding V x H, lm_head and
    verifier_lm_head H x draft vocab, the verifier norm."""
    query, key = heads * head_dim, kv_heads * head_dim
    matrices = aux_layers * hidden * hidden
    norms = hidden + aux_layers * hidden
    for index in range(layers):
        width = 2 * hidden if index == 0 else hidden
        matrices += width * (query + 2 * key) + query * hidden + 3 * hidden * intermediate
        norms += 3 * hidden if index == 0 else 2 * hidden
    frozen = target_vocab * hidden + 2 * hidden * draft_vocab + hidden
    return DraftSize(trainable=matrices + norms, matrices=matrices, frozen=frozen, hidden=hidden,
                     draft_vocab=draft_vocab, target_vocab=target_vocab)


def optimizer_bytes(draft: DraftSize, optimizer: str) -> int:
    """fp32 optimizer state: AdamW two moments per trainable parameter; Muon one momentum per 2-D
    weight and AdamW's two for the rest (speculators' split)."""
    if optimizer == "adamw":
        return 8 * draft.trainable
    return 4 * draft.matrices + 8 * (draft.trainable - draft.matrices)


def activation_bytes(tokens_per_step: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                     intermediate: int, draft_vocab: int, aux_layers: int, ttt_steps: int) -> int:
    """An estimate of what one step keeps for backward: per token the bf16 input states (aux + final
    layer), and per test-time-training step the first layer's bf16 tensors ([embeds, hidden], q, k, v,
    attention out, two residuals, gate/up/act) and three fp32 draft-vocab rows (logits, target
    probabilities, log-softmax). Attention is flex/sdpa: no seq x seq scores are kept."""
    query, key = heads * head_dim, kv_heads * head_dim
    layer = 2 * (4 * hidden + 2 * query + 2 * key + 3 * intermediate)
    per_token = (aux_layers + 1) * hidden * 2 + TOKEN_ID_BYTES + ttt_steps * (layer + 12 * draft_vocab)
    return tokens_per_step * per_token


@dataclass(frozen=True)
class TrainerMemory:
    params_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    reserve_bytes: int

    @property
    def total(self) -> int:
        return self.params_bytes + self.grad_bytes + self.optimizer_bytes + self.activation_bytes + self.reserve_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"params_bytes": self.params_bytes, "grad_bytes": self.grad_bytes,
                "optimizer_bytes": self.optimizer_bytes, "activation_bytes": self.activation_bytes,
                "reserve_bytes": self.reserve_bytes, "total_bytes": self.total}


def trainer_memory(draft: DraftSize, optimizer: str, activations: int, on_gpu: bool) -> TrainerMemory:
    """One training rank's memory: speculators replicates the draft on every rank (no FSDP by default),
    its parameters in fp32, gradients for the trainable ones."""
    return TrainerMemory(params_bytes=4 * draft.params, grad_bytes=4 * draft.trainable,
                         optimizer_bytes=optimizer_bytes(draft, optimizer), activation_bytes=activations,
                         reserve_bytes=TRAINER_RESERVE_BYTES if on_gpu else 0)


def kv_bytes_per_token_per_gpu(kv_bytes_per_token: int, mla: bool, kv_heads: int, tensor_parallel: int) -> int:
    """One token's KV cache on each tensor-parallel rank: MLA's latent is replicated on every rank (vLLM);
    KV heads split over the ranks, or are replicated when there are fewer heads than ranks."""
    if mla:
        return kv_bytes_per_token
    return kv_bytes_per_token * max(kv_heads // tensor_parallel, 1) // max(kv_heads, 1)


def server_kv_tokens(weight_bytes: int, tensor_parallel: int, gpu_memory_bytes: int, share: float,
                     kv_per_token_per_gpu: int) -> int:
    """Tokens of KV cache a server replica holds when it may use `share` of each GPU (vLLM's
    gpu_memory_utilization): what is left after its weights' share and its reserve; < 0: no room."""
    left = int(share * gpu_memory_bytes) - weight_bytes // tensor_parallel - SERVER_RESERVE_BYTES
    return left // max(kv_per_token_per_gpu, 1) if left > 0 else left
