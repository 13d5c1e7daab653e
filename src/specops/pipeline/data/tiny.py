"""The embedded default: a tiny Llama target, its tokenizer and a small chat dataset, made offline.

Everything is generated from fixed seeds, so two generations give byte-identical files and a host
without internet can run the whole pipeline. Dimensions: hidden 64, 4 layers, 2 heads (head_dim 32,
the least the vLLM CPU backend accepts), intermediate 128, vocab 512, float32 safetensors.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from specops import atomic
from specops.atomic import replace_folder

MODEL_DIR = "models/tiny-llama"
DATA_FILE = "data/tiny-chat.jsonl"
SEED = 1234
VOCAB_SIZE = 512
CONVERSATIONS = 300

SPECIAL_TOKENS = ["<|pad|>", "<|begin|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]

# Llama-3 style: each turn is a role header, the content and an end marker; the generation
# prompt is the assistant header. Rendering a prefix gives a prefix of the full rendering, which
# is what the assistant-only loss mask relies on.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

_WORDS = (
    "the a model token layer draft target speculative decoding fast slow green river mountain "
    "cloud train learn predict next word sentence question answer why how what when where small "
    "large tiny quick careful bright dark north south east west number seven three eleven forty "
    "apple orange bread water coffee tea book paper pen screen light shadow music song dance "
    "is are was were has have will can should could would may might must do does did make made "
    "and or but so because if then than with without into onto from over under about around"
).split()
_SUBJECTS = ["the weather", "a river", "speculative decoding", "a tiny model", "the next token",
             "an old book", "green tea", "the mountain", "prime numbers", "a quiet song"]


def _sentence(rng: random.Random, low: int = 4, high: int = 14) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(low, high))]
    return " ".join(words).capitalize() + rng.choice([".", ".", "!", "?"])


def _paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(_sentence(rng) for _ in range(sentences))


def _conversation(rng: random.Random) -> list[tuple[str, str]]:
    turns: list[tuple[str, str]] = []
    if rng.random() < 0.2:
        turns.append(("system", "You are a helpful assistant who answers briefly."))
    for _ in range(rng.choice([1, 1, 2, 3])):
        question = f"Tell me about {rng.choice(_SUBJECTS)}. {_sentence(rng)}"
        turns.append(("user", question))
        turns.append(("assistant", _paragraph(rng, rng.randint(1, 4))))
    return turns


def _as_record(rng: random.Random, turns: list[tuple[str, str]]) -> dict[str, Any]:
    if rng.random() < 0.5:  # ShareGPT shape
        names = {"user": "human", "assistant": "gpt", "system": "system"}
        return {"conversations": [{"from": names[role], "value": text} for role, text in turns]}
    return {"messages": [{"role": role, "content": text} for role, text in turns]}


def chat_lines(seed: int = SEED, count: int = CONVERSATIONS) -> list[str]:
    """JSONL lines of the tiny dataset; a few are deliberately malformed."""
    rng = random.Random(seed)
    lines = [json.dumps(_as_record(rng, _conversation(rng)), sort_keys=True) for _ in range(count)]
    lines[7] = '{"conversations": [{"from": "human", "value": "unterminated'  # not JSON
    lines[23] = json.dumps({"text": "no conversation key"})
    lines[41] = json.dumps({"messages": [{"role": "user", "content": "a question nobody answered"}]})
    return lines


def _tokenizer_corpus(seed: int) -> list[str]:
    rng = random.Random(seed + 1)
    return [_paragraph(rng, 3) for _ in range(2000)] + [f"Tell me about {s}." for s in _SUBJECTS]


def build_tokenizer(seed: int = SEED):
    """A byte-level BPE tokenizer with the chat template, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(_tokenizer_corpus(seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|begin|>", eos_token="<|end|>", pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE, model_max_length=4096,
    )


def build_model(vocab_size: int, seed: int = SEED):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():  # larger than the default init so predictions are confident, not noise
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.08)
    return model


def _save_model_and_tokenizer(folder: Path) -> None:
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(folder)
    # transformers 5 keeps the template in chat_template.jinja; older readers (vLLM's pins, 4.x)
    # look for it in tokenizer_config.json and know the fast tokenizer by its classic name.
    config_file = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text())
    tokenizer_config.update(chat_template=CHAT_TEMPLATE, tokenizer_class="PreTrainedTokenizerFast")
    config_file.write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
    model = build_model(len(tokenizer))
    model.save_pretrained(folder)


def is_complete(root: Path) -> bool:
    model_dir = root / MODEL_DIR
    return all((model_dir / name).exists() for name in ("config.json", "model.safetensors", "tokenizer.json")) \
        and (root / DATA_FILE).exists()


def generate(root: Path, force: bool = False) -> dict[str, Any]:
    """Write the tiny model and data under root (the workdir). Skips what is already complete.

    The model comes from this host's cache of earlier generations when one matches (the same
    generator and library versions give the same bytes), which spares every new workdir importing
    torch and transformers; `force` builds it again and refreshes the cache."""
    model_dir, data_file = root / MODEL_DIR, root / DATA_FILE
    if is_complete(root) and not force:
        return {"generated": False, "model": str(model_dir), "data": str(data_file)}
    from_cache = not force and _copy_from_cache(model_dir)
    if not from_cache:
        print(f"generating the embedded tiny model in {model_dir}", file=sys.stderr)
        replace_folder(model_dir, _save_model_and_tokenizer)
        _store_in_cache(model_dir)
    atomic.write_text(data_file, "\n".join(chat_lines()) + "\n")
    return {"generated": True, "from_cache": from_cache, "model": str(model_dir), "data": str(data_file)}


CACHE_ENV = "SPECOPS_TINY_CACHE"  # a folder, or "off"; default ~/.cache/specops/tiny
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def cache_entry() -> Path | None:
    """This generator's folder in the cache: named by the hash of this file and the versions of the
    libraries that write the model's bytes; None when the cache is off."""
    import hashlib
    import importlib.metadata
    import os

    configured = os.environ.get(CACHE_ENV, "")
    if configured == "off":
        return None
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for package in ("torch", "transformers", "tokenizers", "safetensors"):
        try:
            digest.update(f"{package}=={importlib.metadata.version(package)}\0".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{package}: absent\0".encode())
    folder = Path(configured) if configured else Path.home() / ".cache" / "specops" / "tiny"
    return folder / digest.hexdigest()[:16]


def _copy_from_cache(model_dir: Path) -> bool:
    """The cached model copied into model_dir; False (nothing changed) when there is none to copy."""
    entry = cache_entry()
    if entry is None or not all((entry / name).is_file() for name in MODEL_FILES):
        return False
    try:
        replace_folder(model_dir, lambda staging: _copy_files(entry, staging))
    except OSError:  # another process replacing the entry right now: generate instead
        return False
    return True


def _copy_files(source: Path, target: Path) -> None:
    import shutil

    for file in source.iterdir():
        if file.is_file():
            shutil.copy2(file, target / file.name)


def _store_in_cache(model_dir: Path) -> None:
    """Best effort: a cache that cannot be written (read-only home, full disk) costs the next workdir
    a generation, nothing more. The entry appears whole or not at all (replace_folder)."""
    entry = cache_entry()
    if entry is None:
        return
    try:
        replace_folder(entry, lambda staging: _copy_files(model_dir, staging))
    except OSError as exc:
        print(f"specops: the tiny model was not cached in {entry}: {exc}", file=sys.stderr)
