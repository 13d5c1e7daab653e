"""Where the server and the trainer go when the trainer reads hidden states online, and what refuses a
host: a dense 8B target leaves GPUs for a trainer beside its server (split); Kimi-K2.5's server needs
every GPU of an 8 x 141 GiB host, so the trainer shares them; on 4 such GPUs its weights fit nowhere."""

from __future__ import annotations

from pathlib import Path

from specops.planning import GIB, HostFacts, RunFacts, fits, make_plan, read_target

KIMI = Path(__file__).parent / "kimi-k2.5"
LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def _run(layers: int, mode: str, **extra) -> RunFacts:
    return RunFacts(name="r", layer_ids=[2, layers // 2, layers - 3, layers], hidden_state_dtype="bfloat16",
                    samples=10_000, tokens=20_000_000, tokens_source="given", max_seq_len=2048, mode=mode, **extra)


def test_a_dense_8b_target_splits_the_gpus_between_server_and_trainer(tmp_path: Path) -> None:
    target = read_target(tmp_path, LLAMA_8B)  # no shards: 8.03 B parameters at bf16
    assert target.params == 8_030_261_248 and target.weight_bytes == 2 * 8_030_261_248
    assert target.kv_bytes_per_token(2) == 2 * 8 * 128 * 32 * 2  # K and V, 8 KV heads of 128, 32 layers
    plan = make_plan(target, _run(32, "online"), HostFacts(gpus=8, gpu_memory_bytes=80 * GIB, disk_free_bytes=10**12))
    placement = plan.modes["online"]["placement"]
    assert (placement["kind"], placement["server_gpus"], placement["trainer_gpus"]) == ("split", 1, 7)
    assert fits(plan)


def test_kimi_online_shares_every_gpu_and_a_forced_split_is_refused() -> None:
    target = read_target(KIMI)
    host = HostFacts(gpus=8, gpu_memory_bytes=141 * GIB, disk_free_bytes=3 * 10**12)
    shared = make_plan(target, _run(61, "online"), host)
    placement = shared.modes["online"]["placement"]
    assert placement["kind"] == "shared" and fits(shared)
    # the server's share leaves a training rank its memory: 1 - 38.27 GB / 151.4 GB - 0.02
    trainer = shared.figures["trainer"]["total_bytes"]
    assert 38.2e9 < trainer < 38.3e9  # 32.90 GB of params, grads, Muon state, activations + a 5 GiB reserve
    assert placement["server"]["gpu_memory_utilization"] == round(1 - trainer / (141 * GIB) - 0.02, 3) == 0.727
    forced = make_plan(target, _run(61, "online", placement="split"), host)
    assert not fits(forced)
    assert forced.problems == ["the server needs all 8 GPUs for its weights: none left for the trainer"]


def test_kimi_on_four_gpus_fits_no_mode() -> None:
    plan = make_plan(read_target(KIMI), _run(61, "offline"),
                     HostFacts(gpus=4, gpu_memory_bytes=141 * GIB, disk_free_bytes=3 * 10**12))
    assert not fits(plan) and plan.problems[0].startswith("the server needs ")
    assert "at tensor parallel 4" in plan.problems[0]
    assert plan.recommended["mode"] is None and plan.recommended["reason"].startswith("no mode fits this host")


def test_a_disk_budget_makes_hybrid_keep_its_share() -> None:
    plan = make_plan(read_target(KIMI), _run(61, "hybrid", disk_budget_bytes=500 * 10**9),
                     HostFacts(gpus=8, gpu_memory_bytes=141 * GIB, disk_free_bytes=3 * 10**12))
    hybrid = plan.modes["hybrid"]
    files = plan.figures["hidden_states"]["file_bytes_total"]
    assert hybrid["on_disk_share"] == round(500 * 10**9 / files, 4)
    assert hybrid["hidden_state_bytes_on_disk"] == 500 * 10**9 + plan.figures["hidden_states"]["in_flight_bytes"]
    assert not plan.modes["offline"]["fits"]  # offline would write all 1.15 TB, over the budget
    assert plan.recommended["mode"] == "hybrid"
