"""The names of a checkpoint's tensors, read without loading one: the shard index's weight_map, else each
safetensors file's header (8 bytes little-endian length, then that many bytes of JSON). Standard library
only; a 1T-parameter checkpoint answers in milliseconds."""

from __future__ import annotations

import json
import re
from pathlib import Path

from specops.planning import safetensors_header

INDEX = "model.safetensors.index.json"
_LAYER = re.compile(r"^(.*?)layers\.(\d+)\.")


def weight_names(model_dir: Path) -> tuple[list[str], str] | None:
    """(tensor names, the file they were read from); None when the folder holds no safetensors."""
    index = model_dir / INDEX
    if index.is_file():
        try:
            mapping = json.loads(index.read_text()).get("weight_map")
        except (OSError, ValueError, AttributeError):
            return None
        return (sorted(str(name) for name in mapping), str(index)) if isinstance(mapping, dict) else None
    shards = sorted(model_dir.glob("*.safetensors"))
    names: list[str] = []
    for shard in shards:
        header = safetensors_header(shard)
        if header is None:
            return None
        names.extend(name for name in header if name != "__metadata__")
    return (sorted(names), str(shards[0]) if len(shards) == 1 else str(model_dir / "*.safetensors")) if shards else None


def layer_prefixes(names: list[str]) -> dict[str, set[int]]:
    """{prefix: layer numbers} of every `<prefix>layers.<N>.` name (a wrapper's vision tower counts too)."""
    found: dict[str, set[int]] = {}
    for name in names:
        match = _LAYER.match(name)
        if match:
            found.setdefault(match.group(1), set()).add(int(match.group(2)))
    return found
