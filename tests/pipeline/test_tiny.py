"""The embedded tiny default is deterministic and usable offline."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from specops.pipeline.data import tiny


def digests(root: Path) -> dict[str, str]:
    return {path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file() and "runs" not in path.parts}


def test_generating_twice_gives_byte_identical_files(tiny_workdir, tmp_path):
    assert tiny.generate(tmp_path, force=True)["from_cache"] is False  # built here, not copied
    assert digests(tmp_path) == digests(tiny_workdir)
    assert {"models/tiny-llama/model.safetensors", "models/tiny-llama/tokenizer.json",
            "models/tiny-llama/tokenizer_config.json", "data/tiny-chat.jsonl"} <= set(digests(tmp_path))


def test_the_tiny_target_has_the_promised_shape(tiny_workdir):
    config = json.loads((tiny_workdir / tiny.MODEL_DIR / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (64, 4, 2)
    assert config["hidden_size"] // config["num_attention_heads"] == 32  # vLLM's CPU backend needs >= 32
    assert config["intermediate_size"] == 128 and config["vocab_size"] == 512


def test_the_tokenizer_carries_its_chat_template(tiny_workdir):
    from transformers import AutoTokenizer

    tokenizer_config = json.loads((tiny_workdir / tiny.MODEL_DIR / "tokenizer_config.json").read_text())
    assert tokenizer_config["chat_template"] == tiny.CHAT_TEMPLATE
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_workdir / tiny.MODEL_DIR))
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == "<|begin|><|user|>\nHi<|end|>\n<|assistant|>\n"


def test_the_data_mixes_both_shapes_and_holds_malformed_lines(tiny_workdir):
    lines = (tiny_workdir / tiny.DATA_FILE).read_text().splitlines()
    assert len(lines) == tiny.CONVERSATIONS
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            parsed.append(None)
    assert sum(record is None for record in parsed) == 1
    assert sum(1 for record in parsed if record and "conversations" in record) > 50
    assert sum(1 for record in parsed if record and "messages" in record) > 50


def test_generate_skips_a_complete_tree_unless_forced(tiny_workdir):
    assert tiny.generate(tiny_workdir)["generated"] is False


def test_a_new_workdir_copies_the_model_from_the_hosts_cache_and_a_damaged_entry_is_built_again(
        tmp_path, monkeypatch):
    monkeypatch.setenv(tiny.CACHE_ENV, str(tmp_path / "cache"))
    first = tiny.generate(tmp_path / "first")
    assert first["generated"] is True and first["from_cache"] is False
    entry = tiny.cache_entry()
    assert entry is not None and (entry / "model.safetensors").is_file()
    second = tiny.generate(tmp_path / "second")
    assert second["from_cache"] is True and digests(tmp_path / "second") == digests(tmp_path / "first")

    (entry / "model.safetensors").unlink()  # an entry that lost a file is not used
    third = tiny.generate(tmp_path / "third")
    assert third["from_cache"] is False and digests(tmp_path / "third") == digests(tmp_path / "first")
    assert (entry / "model.safetensors").is_file()  # and the build put it back

    monkeypatch.setenv(tiny.CACHE_ENV, "off")
    assert tiny.cache_entry() is None and tiny.generate(tmp_path / "fourth")["from_cache"] is False


def test_the_gpu_shapes_have_llama_dimensions_without_allocating_them():
    import torch
    from transformers import LlamaForCausalLM

    expected = {"1b": (2048, 16, 32, 8, 8192, 1.0e9), "8b": (4096, 32, 32, 8, 14336, 6.98e9)}
    for shape, (hidden, layers, heads, kv, intermediate, decoder_params) in expected.items():
        config = tiny.llama_config(shape, 512)
        assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                config.num_key_value_heads, config.intermediate_size) == (hidden, layers, heads, kv, intermediate)
        assert config.vocab_size == 512 and config.initializer_range == tiny.INIT_STD
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        embeddings = 2 * 512 * hidden
        assert abs(sum(p.numel() for p in model.parameters()) - embeddings - decoder_params) < 0.03 * decoder_params


def test_a_gpu_shape_generates_deterministically_in_bf16_with_more_conversations(tmp_path, monkeypatch):
    """The 1b code path at a reduced width (the CPU has no room for the real one in a test)."""
    reduced = dict(tiny.LLAMA_DIMENSIONS["1b"], hidden_size=256, num_hidden_layers=2, intermediate_size=512,
                   num_attention_heads=4, num_key_value_heads=2)
    monkeypatch.setitem(tiny.LLAMA_DIMENSIONS, "1b", reduced)
    first = tiny.generate_shape(tmp_path / "a", "1b")
    assert first["generated"] and tiny.generate_shape(tmp_path / "a", "1b")["generated"] is False
    tiny.generate_shape(tmp_path / "b", "1b")
    assert digests(tmp_path / "a") == digests(tmp_path / "b")
    config = json.loads((tmp_path / "a" / tiny.model_dir_for("1b") / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["dtype"]) == (256, 2, "bfloat16")
    lines = (tmp_path / "a" / tiny.data_file_for("1b")).read_text().splitlines()
    assert len(lines) == tiny.SHAPE_CONVERSATIONS > tiny.CONVERSATIONS


def test_a_random_llama_at_the_generators_scale_answers_by_its_context():
    """Greedy answers are not noise: the next token follows the prompt, and few top-1s are near-ties."""
    import torch

    config = tiny.llama_config("8b", 512, hidden_size=512, num_hidden_layers=2, intermediate_size=1024,
                               num_attention_heads=4, num_key_value_heads=2)
    model = tiny.random_llama(config, torch.device("cpu"), torch.float32)
    prompts = torch.randint(6, 512, (8, 40), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        logits = model(input_ids=prompts).logits[:, -1]
    top = logits.topk(2, -1).values
    assert len(set(logits.argmax(-1).tolist())) >= 6  # different prompts, different answers
    assert float((top[:, 0] - top[:, 1]).median()) > 0.02 * float(logits.std())
    with torch.inference_mode():  # the same recent tokens after another context: mostly the same answer
        other = model(input_ids=torch.cat([prompts.roll(1, 0)[:, :30], prompts[:, 30:]], 1)).logits[:, -1]
    assert float((other.argmax(-1) == logits.argmax(-1)).float().mean()) >= 0.75


def test_the_gpu_run_configs_use_their_generated_targets():
    from specops.pipeline.run.config import load_run_config

    for shape in ("1b", "8b"):
        config = load_run_config(Path(__file__).parents[2] / "runs" / f"gpu-{shape}.yaml")
        assert (config.embedded, config.model, config.data) == (shape, tiny.model_dir_for(shape),
                                                                 tiny.data_file_for(shape))
        assert config.dtype == "bfloat16" and config.train.total_seq_len == 8192
        assert config.samples + config.evaluate.heldout_prompts <= tiny.SHAPE_CONVERSATIONS - 3  # 3 malformed
