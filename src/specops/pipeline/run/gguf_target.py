"""Where a run's GGUF target lives as a model folder (the data room's `gguf` module writes it).

A run whose `model:` names a `.gguf` file (a path, or `pkg:MODULE/FILE.gguf`) is served, extracted and trained
from `<workdir>/models/gguf/<file stem>-<digest>-<dtype>`: kept by the file's content, so a changed file is a
new folder (and the manifest's model digest reruns what depends on the target), and shared by every run of the
workdir that names the same file in the same dtype.
"""

from __future__ import annotations

import json
from pathlib import Path

from specops.contract.errors import BadInput
from specops.host import atomic

SUFFIX = ".gguf"
FOLDER = Path("models") / "gguf"
SOURCE_FILE = "gguf_source.json"  # in the folder: the GGUF's path, digest, size, dtype, architecture
DIGESTS_FILE = "digests.json"


def is_gguf(model: str) -> bool:
    return model.lower().endswith(SUFFIX)


def gguf_digest(path: Path, root: Path) -> str:
    """sha256 of the file (the first 16 hex digits), remembered by (path, size, mtime) under the models folder: a
    Kimi-sized GGUF is hundreds of GB, and every step asks for its folder."""
    from specops.pipeline.run.fingerprint import file_digest

    stat = path.stat()
    key = str(path.resolve())
    index_file = root / FOLDER / DIGESTS_FILE
    try:
        known = json.loads(index_file.read_text())
    except (OSError, json.JSONDecodeError):
        known = {}
    known = known if isinstance(known, dict) else {}
    entry = known.get(key)
    if isinstance(entry, dict) and entry.get("size") == stat.st_size and entry.get("mtime_ns") == stat.st_mtime_ns:
        return str(entry["digest"])
    found = file_digest(path)
    known[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "digest": found}
    try:
        atomic.write_text(index_file, json.dumps(known, indent=1, sort_keys=True) + "\n")
    except OSError:  # a read-only models folder: the digest is computed again next time, nothing more
        pass
    return found


def written_dtype(dtype_setting: str) -> str:
    """The dtype the weights are written in: the one the target computes in on this host (bf16 on GPUs, fp32 on
    CPUs, unless the run says), so no step converts them again."""
    from specops.host.gpus import device_count
    from specops.planning import hidden_state_dtype

    return hidden_state_dtype(dtype_setting, device_count() > 0)


def gguf_file(value: str, resolved: Path, config_file: Path) -> Path:
    if not resolved.is_file():
        raise BadInput(f"{config_file}: model: {value}: no such GGUF file ({resolved})")
    return resolved


def gguf_folder(path: Path, root: Path, dtype_setting: str) -> Path:
    stem = path.name[: -len(SUFFIX)]
    return root / FOLDER / f"{stem}-{gguf_digest(path, root)}-{written_dtype(dtype_setting)}"


def gguf_source(folder: Path) -> dict | None:
    """What a model folder was written from (the GGUF's path, digest, size; the dtype), or None: no GGUF target."""
    try:
        record = json.loads((folder / SOURCE_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None
