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
