"""Tiny training inputs in exactly the formats speculators 0.9.0 reads, generated locally.

A random-weight Llama verifier (H=64, 4 layers, 2 heads, vocab 512) with a word-level tokenizer,
a prepared dataset (HF arrow on disk: input_ids, loss_mask, seq_len, torch format), token_freq.pt
(dict token id -> count over assistant tokens) and hidden_states/hs_{i}.safetensors
(token_ids [seq] int64, hidden_states [seq, n_layers, H] bf16, last slice = final layer).
Nothing comes from a hub. `TinyHost`: a workdir and a throwaway site holding speculators, its agent run
with that site first on the path, and runs over these inputs (the training tests).
"""

from __future__ import annotations

import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.support.agent import REPO, run_agent, start_agent

HIDDEN = 64
LAYERS = 4
VOCAB = 512
AUX_LAYER_IDS = (1, 2, 3)  # captured layers; the final layer is appended after them


@dataclass(frozen=True)
class TinyInputs:
    verifier: Path
    data: Path
    hidden_states: Path
    token_freq: dict[int, int]


def build_verifier(folder: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=LAYERS,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    # Word-level vocabulary "t0".."t511": small, deterministic, no training corpus needed.
    vocab = {f"t{i}": i for i in range(VOCAB)}
    vocab.update({"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        unk_token="<unk>",
    )
    tokenizer.save_pretrained(folder)
    return folder


def build_data(verifier: Path, data: Path, hidden: Path, samples: int = 48, seq_len: int = 48,
               seed: int = 0) -> TinyInputs:
    """Verifier, prepared dataset (with token_freq.pt) and hidden states at the given folders."""
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file

    build_verifier(verifier)
    hidden.mkdir(parents=True)
    generator = torch.Generator().manual_seed(seed)
    # Zipf-like token distribution so the draft vocabulary has something to choose.
    weights = 1.0 / torch.arange(1, VOCAB + 1, dtype=torch.float64)
    rows: dict[str, list] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    freq: Counter[int] = Counter()
    for index in range(samples):
        ids = torch.multinomial(weights, seq_len, replacement=True, generator=generator).to(torch.int64)
        mask = torch.zeros(seq_len, dtype=torch.int64)
        mask[seq_len // 3:] = 1  # the "assistant" part
        rows["input_ids"].append(ids.tolist())
        rows["loss_mask"].append(mask.tolist())
        rows["seq_len"].append(seq_len)
        freq.update(ids[mask.bool()].tolist())
        states = torch.randn(seq_len, len(AUX_LAYER_IDS) + 1, HIDDEN, generator=generator)
        save_file({"token_ids": ids, "hidden_states": states.to(torch.bfloat16)},
                  str(hidden / f"hs_{index}.safetensors"))
    dataset = Dataset.from_dict(rows)
    dataset.set_format(type="torch")
    dataset.save_to_disk(str(data))
    token_freq = dict(freq)
    torch.save(token_freq, data / "token_freq.pt")
    return TinyInputs(verifier=verifier, data=data, hidden_states=hidden, token_freq=token_freq)


class TinyHost:
    def __init__(self, root: Path) -> None:
        self.workdir = root / "workdir"
        self.site = root / "site"

    def agent(self, *args: str, check: bool = True) -> dict:
        code, document, stderr = run_agent(self.workdir, *args, sites=(self.site,))
        assert not check or code == 0, (document, stderr[-3000:])
        return document

    def start_agent(self, *args: str) -> subprocess.Popen:
        # a session of its own, so the test can kill the agent and its trainer together
        return start_agent(self.workdir, *args, sites=(self.site,), stderr=subprocess.DEVNULL,
                           start_new_session=True)

    def add_run(self, name: str, epochs: int) -> Path:
        run_dir = self.workdir / "runs" / name
        inputs = self.workdir / "inputs"
        run_dir.mkdir(parents=True)
        (run_dir / "prepared").symlink_to(inputs / "prepared")
        (run_dir / "hidden_states").symlink_to(inputs / "hidden_states")
        config = {"model": str(inputs / "verifier"), "data": "conversations.jsonl",
                  "layer_ids": [*AUX_LAYER_IDS, LAYERS], "draft": {"vocab_size": 256},
                  "train": {"epochs": epochs, "lr": 1e-3,
                            "extra_args": ["--total-seq-len", "96", "--checkpoint-freq", "0.5"]}}
        (self.workdir / "runs" / f"{name}.yaml").write_text(yaml.safe_dump(config))
        return run_dir


def patched_host(folder: Path) -> TinyHost:
    """A host in `folder` with speculators 0.9.0 installed, the tiny training inputs built and the CPU patch set
    applied: what the training tests start from."""
    from tests.support.wheels import site_with

    host = TinyHost(folder)
    site_with(host.site, ("speculators", "0.9.0"))
    inputs = host.workdir / "inputs"
    build_data(inputs / "verifier", inputs / "prepared", inputs / "hidden_states")
    host.workdir.mkdir(parents=True, exist_ok=True)
    host.agent("patch", "apply", "--set", "speculators-0.9.0-cpu", "--patches-dir", str(REPO / "patches"))
    return host
