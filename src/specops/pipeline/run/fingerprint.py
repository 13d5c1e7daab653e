"""Cheap fingerprints of step inputs: data files by content, models by their small files and sizes."""

from __future__ import annotations

import hashlib
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt")


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in blocks (checkpoints and hidden states can be large)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    return file_sha256(path)[:16]


def tokenizer_digest(model_path: Path) -> str:
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = model_path / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def model_digest(model_path: Path) -> str:
    """config.json by content, weight files by name and size: hashing 100s of GB is not cheap."""
    digest = hashlib.sha256()
    config = model_path / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    for weights in sorted(model_path.glob("*.safetensors")) + sorted(model_path.glob("*.bin")):
        digest.update(f"{weights.name}:{weights.stat().st_size}\0".encode())
    return digest.hexdigest()[:16]
