"""The vocab step: the draft vocabulary, from the assistant-token frequencies that prepare counted.

speculators 0.9.0 reads two numpy files (`--d2t-path`, `--t2d-path`):
  d2t int64 [draft_vocab]   target id = i + d2t[i]
  t2d bool  [target_vocab]  True where the target token is in the draft vocabulary
The draft vocabulary is the `draft_vocab` most frequent tokens (ties broken by the smaller id), topped
up with the smallest unused ids when fewer tokens were seen, in ascending target-id order: the same
choice speculators makes when it builds the mapping itself, so either path trains the same draft.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specops.contract.errors import BadInput
from specops.host.atomic import write_bytes, write_json

REPORT_SIZES = (8192, 16384, 32768, 65536)
REPORT_FILE = "vocab.json"


@dataclass(frozen=True)
class VocabOutputs:
    d2t: Path
    t2d: Path
    report: Path


def outputs_in(folder: Path, draft_vocab: int) -> VocabOutputs:
    return VocabOutputs(folder / f"d2t-{draft_vocab}.npy", folder / f"t2d-{draft_vocab}.npy",
                        folder / REPORT_FILE)


def load_token_freq(path: Path) -> dict[int, int]:
    """token_freq.pt as written by speculators prepare-data: {token id: count}."""
    import torch  # heavy; only this reader needs it

    if not path.is_file():
        raise BadInput(f"{path}: token frequencies missing (run the prepare step with token counting)")
    try:
        raw = torch.load(path, weights_only=True)
    except Exception as exc:
        raise BadInput(f"{path}: not a readable token frequency file: {exc}") from None
    if not isinstance(raw, dict):
        raise BadInput(f"{path}: expected a dict of token id -> count, got {type(raw).__name__}")
    freq: dict[int, int] = {}
    for token, count in raw.items():
        token_id, number = int(token), int(count)
        if token_id < 0 or number < 0:
            raise BadInput(f"{path}: key {token}: token ids and counts must be non-negative")
        freq[token_id] = number
    return freq


def target_vocab_size(verifier: Path) -> int:
    """vocab_size from the verifier's config.json (text_config first, as for multimodal models)."""
    config_file = verifier / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"{config_file}: cannot read the verifier config: {exc}") from None
    size = (config.get("text_config") or {}).get("vocab_size") or config.get("vocab_size")
    if not isinstance(size, int) or size <= 0:
        raise BadInput(f"{config_file}: key 'vocab_size' is missing or not a positive integer")
    return size


def select_draft_tokens(freq: dict[int, int], draft_vocab: int) -> np.ndarray:
    """Ascending target ids of the draft vocabulary."""
    ranked = sorted(freq, key=lambda token: (-freq[token], token))[:draft_vocab]
    chosen = set(ranked)
    filler = (token for token in range(draft_vocab + len(chosen)) if token not in chosen)
    while len(ranked) < draft_vocab:
        ranked.append(next(filler))
    return np.sort(np.asarray(ranked, dtype=np.int64))


def build_mapping(freq: dict[int, int], draft_vocab: int, target_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(d2t, t2d) for a draft vocabulary of `draft_vocab` tokens out of `target_vocab`."""
    if not 0 < draft_vocab <= target_vocab:
        raise BadInput(f"draft vocab size {draft_vocab} must be between 1 and the target vocab {target_vocab}")
    outside = [token for token in freq if token >= target_vocab]
    if outside:
        raise BadInput(f"token id {max(outside)} is outside the target vocabulary of {target_vocab}")
    tokens = select_draft_tokens(freq, draft_vocab)
    d2t = tokens - np.arange(draft_vocab, dtype=np.int64)
    t2d = np.zeros(target_vocab, dtype=np.bool_)
    t2d[tokens] = True
    return d2t, t2d


def coverage(freq: dict[int, int], sizes: list[int], target_vocab: int) -> list[dict[str, Any]]:
    """Share of assistant-token occurrences inside a draft vocabulary of each size (clipped to target)."""
    counts = np.sort(np.fromiter(freq.values(), dtype=np.int64))[::-1]
    total = int(counts.sum())
    cumulative = np.concatenate([[0], np.cumsum(counts)])
    rows = []
    for size in sorted({min(size, target_vocab) for size in sizes}):
        covered = int(cumulative[min(size, len(counts))])
        rows.append({"draft_vocab": size, "covered": covered, "total": total,
                     "share": covered / total if total else 0.0})
    return rows


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _inputs_digest(token_freq: Path, draft_vocab: int, target_vocab: int) -> str:
    digest = hashlib.sha256(token_freq.read_bytes())
    digest.update(f"draft={draft_vocab};target={target_vocab};v1".encode())
    return digest.hexdigest()


def build_vocab(token_freq: Path, draft_vocab: int, target_vocab: int, folder: Path) -> dict[str, Any]:
    """Write d2t/t2d and the coverage report into `folder`; skip when inputs and outputs are unchanged."""
    outputs = outputs_in(folder, draft_vocab)
    digest = _inputs_digest(token_freq, draft_vocab, target_vocab)
    previous = read_report(outputs.report)
    if previous.get("inputs_sha256") == digest and outputs.d2t.is_file() and outputs.t2d.is_file():
        return {**previous, "skipped": True}
    freq = load_token_freq(token_freq)
    d2t, t2d = build_mapping(freq, draft_vocab, target_vocab)
    write_bytes(outputs.d2t, _npy_bytes(d2t))
    write_bytes(outputs.t2d, _npy_bytes(t2d))
    report = {
        "inputs_sha256": digest,
        "token_freq": str(token_freq),
        "draft_vocab": draft_vocab,
        "target_vocab": target_vocab,
        "distinct_tokens_seen": len(freq),
        "d2t": str(outputs.d2t),
        "t2d": str(outputs.t2d),
        "coverage": coverage(freq, [*REPORT_SIZES, draft_vocab], target_vocab),
    }
    write_json(outputs.report, report)  # written last: its digest vouches for the npy files
    return {**report, "skipped": False}


def read_report(path: Path) -> dict[str, Any]:
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}
