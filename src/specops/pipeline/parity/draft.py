"""A draft folder and the files training was given, read with the standard library only.

config.json as speculators wrote it; the tensor shapes of model.safetensors from its JSON header (d2t: one
entry per draft token, t2d: one per target token); a .npy file's length from its header; the defaults of
speculators' Eagle-3 config fields (what training used where config.json has no such key) from its source.
"""

from __future__ import annotations

import ast
import json
import struct
from pathlib import Path
from typing import Any

from specops.contract.errors import BadInput

SPECULATORS_CONFIG = "speculators.models.{kind}.config"  # each kind's speculator config class (0.9.0)


def tensor_shapes(folder: Path) -> dict[str, list[int]]:
    """{tensor name: shape} from model.safetensors' header (8-byte length, then JSON); {} without the file."""
    path = folder / "model.safetensors"
    if not path.is_file():
        return {}
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    return {name: entry["shape"] for name, entry in header.items() if name != "__metadata__"}


def npy_length(path: Path) -> int | None:
    """The first dimension of a .npy array, from its header; None when the file is not there."""
    if not path.is_file():
        return None
    with path.open("rb") as handle:
        magic = handle.read(8)
        if magic[:6] != b"\x93NUMPY":
            raise BadInput(f"{path}: not a .npy file")
        size = struct.unpack("<H" if magic[6] == 1 else "<I", handle.read(2 if magic[6] == 1 else 4))[0]
        header = ast.literal_eval(handle.read(size).decode("latin1"))
    shape = header.get("shape") or (0,)
    return int(shape[0])


def speculators_defaults(kind: str = "eagle3", search_path: list[str] | None = None) -> dict[str, Any]:
    """{field: default} of the kind's speculator config in speculators (Eagle3SpeculatorConfig for eagle3:
    `x: bool = Field(default=False, ...)`, `x: int = 3`)."""
    from specops.analysis import ModuleIndex

    index = ModuleIndex(search_path)
    file = index.module_file(SPECULATORS_CONFIG.format(kind=kind)) if kind.isidentifier() else None
    tree = index.tree(file) if file is not None else None
    defaults: dict[str, Any] = {}
    for node in ast.walk(tree) if tree is not None else ():
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None):
            continue
        value = node.value
        if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Field":
            value = next((keyword.value for keyword in value.keywords if keyword.arg == "default"), None)
        try:
            defaults[node.target.id] = ast.literal_eval(value) if value is not None else None
        except ValueError:
            continue
    return defaults
