"""The embedded default: a tiny Llama target, its tokenizer and a small chat dataset, made offline.

Everything is generated from fixed seeds, so two generations give byte-identical files and a host
without internet can run the whole pipeline. Dimensions: hidden 64, 4 layers, 2 heads (head_dim 32,
the least the vLLM CPU backend accepts), intermediate 128, vocab 512, float32 safetensors.

Shapes "1b" and "8b" (`python -m specops tiny --shape 8b`, run key `embedded: 8b`) are random Llamas at
Llama-3.2-1B and Llama-3.1-8B dimensions with the same tokenizer (vocab 512) and more conversations:
targets for a GPU host that run every step at its real rate without a download. They are made on
the GPU in bf16 when there is one (seconds, where the CPU would take minutes), deterministic for a
device type, and never cached (16 GB at 8B).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from specops.host import atomic
from specops.host.atomic import replace_folder

MODEL_DIR = "models/tiny-llama"
DATA_FILE = "data/tiny-chat.jsonl"
SEED = 1234
VOCAB_SIZE = 512
CONVERSATIONS = 300

# Llama-3.2-1B and Llama-3.1-8B dimensions (their config.json files), vocab aside.
LLAMA_DIMENSIONS: dict[str, dict[str, Any]] = {
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
               head_dim=64, intermediate_size=8192, max_position_embeddings=8192, rope_theta=500000.0),
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
               head_dim=128, intermediate_size=14336, max_position_embeddings=8192, rope_theta=500000.0),
}
KIMI_SHAPES = ("kimi", "kimi-text", "kimi-gpu", "kimi-int4")  # data/tiny_kimi.py: Kimi-K2.5's layout
SHAPES = ("tiny", *LLAMA_DIMENSIONS, *KIMI_SHAPES)
SHAPE_CONVERSATIONS = 2400  # the GPU shapes: enough rows that every step runs past its start-up
INIT_STD = 0.02  # Llama's initializer_range (random_llama: embeddings and residual writes differ)


def model_dir_for(shape: str) -> str:
    if shape in KIMI_SHAPES:
        from specops.pipeline.data import tiny_kimi

        return tiny_kimi.model_dir_for(shape)
    return MODEL_DIR if shape == "tiny" else f"models/random-llama-{shape}"


def data_file_for(shape: str) -> str:
    small = ("tiny", "kimi", "kimi-text", "kimi-int4")
    return DATA_FILE if shape in small else f"data/chat-{SHAPE_CONVERSATIONS}.jsonl"

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


def llama_config(shape: str, vocab_size: int, **overrides: Any):
    """The transformers config of a GPU shape (overrides: a reduced width for tests on a CPU)."""
    from transformers import LlamaConfig

    dims = {**LLAMA_DIMENSIONS[shape], **overrides}
    return LlamaConfig(vocab_size=vocab_size, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                       eos_token_id=2, pad_token_id=0, initializer_range=INIT_STD, **dims)


def random_llama(config: Any, device: Any, dtype: Any, seed: int = SEED, learnable: bool = True):
    """A Llama with random weights whose greedy answers a draft can learn, made where it will run.

    Matrices normal(0, initializer_range) and unit norms, except: the token embeddings normal(0, 1)
    and the two projections that write into the residual stream (o_proj, down_proj) scaled by
    1/sqrt(2 x layers). With every matrix at 0.02 each layer adds as much as the embedding holds, the
    next token is a chaotic function of the whole context (a reduced width: the same next token for
    the same current token at 30 % of positions; a 1-layer draft at 1B dimensions reached an
    acceptance length of 1.04). Kept on the embedding's path it is a learnable function of the recent
    tokens (96 % at that width), with as many distinct answers and no more near-ties.

    learnable=False keeps every matrix at 0.02: a target whose every layer moves its answers (what a
    check for states of the wrong layer needs). Built on the meta device and filled in place on
    `device` (no CPU copy of 16 GB at 8B and no slow default init); the same seed, device type and
    library versions give the same weights.
    """
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(dtype)
    model = model.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:  # norm weights
                parameter.fill_(1.0)
            else:
                parameter.normal_(0.0, config.initializer_range, generator=generator)
        if learnable:
            model.model.embed_tokens.weight.normal_(0.0, 1.0, generator=generator)
        for layer in model.model.layers if learnable else []:
            layer.self_attn.o_proj.weight.mul_((2 * config.num_hidden_layers) ** -0.5)
            layer.mlp.down_proj.weight.mul_((2 * config.num_hidden_layers) ** -0.5)
    # the rotary inv_freq buffer is no parameter: to_empty left it as garbage, so build it again
    rotary = model.model.rotary_emb
    model.model.rotary_emb = type(rotary)(config=model.config).to(device)
    return model.eval()


def _save_shape(folder: Path, shape: str) -> None:
    import torch

    tokenizer = _save_tokenizer(folder)
    on_gpu = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float32)
    model = random_llama(llama_config(shape, len(tokenizer)), torch.device(device), dtype)
    model.config.dtype = torch.bfloat16
    model.to(torch.bfloat16).save_pretrained(folder)


def _save_tokenizer(folder: Path):
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(folder)
    # transformers 5 keeps the template in chat_template.jinja; older readers (vLLM's pins, 4.x)
    # look for it in tokenizer_config.json and know the fast tokenizer by its classic name.
    config_file = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text())
    tokenizer_config.update(chat_template=CHAT_TEMPLATE, tokenizer_class="PreTrainedTokenizerFast")
    config_file.write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
    return tokenizer


def _save_model_and_tokenizer(folder: Path) -> None:
    tokenizer = _save_tokenizer(folder)
    model = build_model(len(tokenizer))
    model.save_pretrained(folder)


def is_complete(root: Path, shape: str = "tiny") -> bool:
    model_dir = root / model_dir_for(shape)
    single_file = shape in ("tiny", "kimi", "kimi-text", "kimi-int4")
    weights = ("model.safetensors",) if single_file else ("model.safetensors.index.json",)
    if shape != "tiny" and not (model_dir / weights[0]).exists():
        weights = ("model.safetensors",)  # a single shard: small enough for one file
    tokenizer = "tiktoken.json" if shape in KIMI_SHAPES else "tokenizer.json"  # Kimi's: remote code reads it
    return all((model_dir / name).exists() for name in ("config.json", *weights, tokenizer)) \
        and (root / data_file_for(shape)).exists()


def planned_config(root: Path, shape: str) -> dict[str, Any] | None:
    """config.json of an embedded GPU shape not generated yet, made in memory from its dimensions (no weights,
    nothing written): what `plan` reads instead of generating gigabytes. None: the tiny shape (a cached copy
    of a few hundred KB, made as the first step makes it) or a shape already generated."""
    if shape == "tiny" or is_complete(root, shape):
        return None
    tokenizer = build_tokenizer()
    if shape in KIMI_SHAPES:
        from specops.pipeline.data import tiny_kimi

        return tiny_kimi.published_config(tiny_kimi.model_config(shape, tiny_kimi.vocab_for(shape, tokenizer)), shape)
    config = llama_config(shape, len(tokenizer)).to_dict()
    config["dtype"] = "bfloat16"
    return config


def _size(root: Path, shape: str) -> str:
    """", ~3.4 GB": what a GPU shape's weights will take, said before they are generated (from its config)."""
    from specops import planning

    config = planned_config(root, shape) if shape in (*LLAMA_DIMENSIONS, "kimi-gpu") else None  # GPU sizes only
    weights = None if config is None else planning.read_target(root / model_dir_for(shape), config).weight_bytes
    return "" if weights is None else f", ~{weights / 1e9:.1f} GB"


def generate_shape(root: Path, shape: str, force: bool = False) -> dict[str, Any]:
    """Write a GPU shape's model and its conversations under root, unless already complete."""
    if shape == "tiny":
        return generate(root, force)
    if shape in KIMI_SHAPES:
        return _generate_kimi(root, shape, force)
    if shape not in LLAMA_DIMENSIONS:
        raise ValueError(f"shape {shape!r} is not one of {', '.join(SHAPES)}")
    model_dir, data_file = root / model_dir_for(shape), root / data_file_for(shape)
    if is_complete(root, shape) and not force:
        return {"generated": False, "shape": shape, "model": str(model_dir), "data": str(data_file)}
    print(f"generating a random Llama at {shape} dimensions{_size(root, shape)} in {model_dir}", file=sys.stderr)
    replace_folder(model_dir, lambda staging: _save_shape(staging, shape))
    atomic.write_text(data_file, "\n".join(chat_lines(count=SHAPE_CONVERSATIONS)) + "\n")
    return {"generated": True, "shape": shape, "model": str(model_dir), "data": str(data_file)}


def _generate_kimi(root: Path, shape: str, force: bool) -> dict[str, Any]:
    """A Kimi-K2.5-shaped target (data/tiny_kimi.py) with the tiny tokenizer and conversations (the
    tiny shapes) or the GPU shapes' conversations."""
    from specops.pipeline.data import tiny_kimi

    model_dir, data_file = root / model_dir_for(shape), root / data_file_for(shape)
    if is_complete(root, shape) and not force:
        return {"generated": False, "shape": shape, "model": str(model_dir), "data": str(data_file)}
    import torch

    print(f"generating a Kimi-K2.5-shaped target ({shape}){_size(root, shape)} in {model_dir}", file=sys.stderr)
    tiny_kimi.generate(root, shape, build_tokenizer(), on_gpu=shape == "kimi-gpu" and torch.cuda.is_available())
    count = CONVERSATIONS if shape != "kimi-gpu" else SHAPE_CONVERSATIONS
    atomic.write_text(data_file, "\n".join(chat_lines(count=count)) + "\n")
    return {"generated": True, "shape": shape, "model": str(model_dir), "data": str(data_file)}


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
