"""The plan of a Kimi-K2.5-shaped target (its real config.json's dimensions, config files only) on one
host of 8 GPUs x 141 GiB with 3 TB free, 10k conversations of 2k tokens: every figure against a hand
computation written out beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from specops.planning import GIB, HostFacts, Rate, Rates, RunFacts, make_plan, read_target

KIMI = Path(__file__).parent / "kimi-k2.5"
H, LAYERS, VOCAB, EXPERTS, MOE_I, DENSE_I = 7168, 61, 163840, 384, 2048, 18432
TOKENS = 10_000 * 2_000


@pytest.fixture(scope="module")
def plan():
    target = read_target(KIMI)
    run = RunFacts(name="kimi", layer_ids=[2, 30, 58, 61], hidden_state_dtype="bfloat16", samples=10_000,
                   tokens=TOKENS, tokens_source="given", max_seq_len=2048, epochs=10, draft_vocab=32000)
    host = HostFacts(gpus=8, gpu_memory_bytes=141 * GIB, disk_free_bytes=3 * 10**12)
    rates = Rates(extract=Rate(20_000, "run config"), train=Rate(40_000, "run config"))
    return make_plan(target, run, host, rates)


def test_hidden_states_per_token_and_in_total(plan) -> None:
    states = plan.figures["hidden_states"]
    assert states["bytes_per_token"] == 4 * 7168 * 2 == 57_344  # 3 auxiliary layers + the final one, bf16
    assert states["bytes_total"] == 20_000_000 * 57_344 == 1_146_880_000_000  # ≈ 1.15 TB
    # on disk each file adds int64 token ids (8 B a token) and a header of 160 B
    assert states["file_bytes_total"] == 20_000_000 * (57_344 + 8) + 10_000 * 160


def test_parameters_of_the_deepseek_v3_layout(plan) -> None:
    mla = (H * 1536 + 1536 * 64 * (128 + 64)  # q_a, q_b
           + H * (512 + 64) + 512 * 64 * (128 + 128)  # kv_a_proj_with_mqa, kv_b
           + 64 * 128 * H)  # o_proj
    assert mla == 101_122_048
    moe = H * EXPERTS + EXPERTS + 3 * H * MOE_I * (EXPERTS + 1)  # router, its bias, 384 routed + 1 shared
    norms = LAYERS * (2 * H + 1536 + 512) + H
    total = 2 * VOCAB * H + LAYERS * mla + 3 * H * DENSE_I + 60 * moe + norms
    assert plan.target.params == total == 1_026_408_232_448  # ≈ 1.03 T


def test_weights_at_their_stored_size(plan) -> None:
    routed = 60 * 3 * EXPERTS * H * MOE_I  # int4 in groups of 32: 0.5 B + one bf16 scale per 32 = 0.5625 B
    assert plan.target.weight_bytes == int(routed * 0.5625 + (plan.target.params - routed) * 2)
    assert plan.target.weight_bytes == 594_205_305_856  # ≈ 594 GB (bf16 throughout would be 2.05 TB)
    assert plan.target.weight_source.startswith("config")


def test_weights_once_loaded_as_stored_by_vllm_and_decompressed_by_transformers(plan) -> None:
    """`plan` shows both (issue 59): vLLM keeps the int4 experts packed; transformers decompresses them to the
    dtype it computes in, so an hf-backend load of Kimi-K2.5 holds 2.05 TB in bf16, not 594 GB."""
    memory = plan.target.memory_bytes("bfloat16")
    assert memory == {"vllm": 594_205_305_856, "transformers": 1_026_408_232_448 * 2}
    assert plan.to_dict()["target"]["memory_bytes"] == plan.target.memory_bytes(plan.run.hidden_state_dtype)


def test_server_tensor_parallel_and_mla_kv_cache(plan) -> None:
    server = plan.figures["server"]
    assert server["kv_bytes_per_token"] == (512 + 64) * 61 * 2 == 70_272  # one latent + rope key per layer
    # 594 GB / 4 = 148.6 GB > 60% of 141 GiB: the fewest GPUs that hold the weights is 8
    assert (server["tensor_parallel"], server["data_parallel"]) == (8, 1)
    assert server["weights_per_gpu_bytes"] == 594_205_305_856 // 8
    # 0.9 x 141 GiB - 74.3 GB of weights - 4 GiB reserve, over 70,272 B a token (MLA: not split by TP)
    assert server["kv_tokens"] == (int(0.9 * 141 * GIB) - 594_205_305_856 // 8 - 4 * GIB) // 70_272 == 820_913


def test_draft_and_its_trainer(plan) -> None:
    trainer = plan.figures["trainer"]
    layer = 2 * H * (3 * 64 * 112) + 64 * 112 * H + 3 * H * DENSE_I  # q/k/v from [embeds, hidden], o, MLP
    trainable = 3 * H * H + layer + 7 * H  # fc, the layer; norms: over the 3 aux states, 3 in the layer, final
    assert trainable == 910_214_144
    frozen = VOCAB * H + 2 * H * 32000 + H  # embedding, lm_head + verifier_lm_head at the draft vocab, norm
    assert (trainer["trainable_params"], trainer["draft_params"]) == (trainable, trainable + frozen)
    assert trainer["draft_params"] == 2_543_378_432
    # Muon: one fp32 momentum per 2-D weight, AdamW's two per norm weight
    assert trainer["optimizer_bytes"] == 4 * (trainable - 7 * H) + 8 * 7 * H == 3_641_057_280
    assert trainer["params_bytes"] == 4 * 2_543_378_432 and trainer["grad_bytes"] == 4 * trainable
    per_token = 4 * H * 2 + 8 + 3 * (2 * (4 * H + 2 * 7168 + 2 * 7168 + 3 * DENSE_I) + 12 * 32000)
    assert trainer["activation_bytes"] == 8192 * per_token == 15_443_492_864


def test_disk_per_mode_and_the_recommendation(plan) -> None:
    offline, online = plan.modes["offline"], plan.modes["online"]
    # every epoch kept: bf16 weights (less verifier_lm_head and its norm), bf16 optimizer state, d2t, t2d, files
    checkpoints = 10 * (2 * (2_543_378_432 - H * 32000 - H) + 3_641_057_280 // 2 + 8 * 32000 + VOCAB + 16 * 1024)
    assert offline["disk_bytes"] == plan.figures["hidden_states"]["file_bytes_total"] + 12 * TOKENS + checkpoints
    assert offline["fits"] and online["fits"]
    assert online["hidden_state_bytes_on_disk"] == 32 * (2048 * 57_352 + 160)  # only what is in flight
    # the server needs all 8 GPUs for its weights: online shares them with the trainer
    assert online["placement"]["kind"] == "shared" and online["placement"]["server_gpus"] == 8
    assert plan.recommended["mode"] == "offline" and "10 epochs" in plan.recommended["reason"]
    # times from the given rates: 20M tokens / 20k/s; 10 epochs x 20M / 40k/s
    assert (offline["extract_s"], offline["train_s"]) == (1000.0, 5000.0)
    assert online["train_s"] == 10 * 20_000_000 / 20_000  # served at the slower of server and trainer
