"""Hidden-state files as speculators 0.9 reads them, written atomically by background threads.

One file per prepared sample i: `hs_{i}.safetensors` holding
    token_ids      int64 [seq]
    hidden_states  model dtype [seq, n_layers, hidden]   (last slice = final layer, pre-norm)
(speculators.train.data.ArrowDataset loads it through hs_connectors.FileTransfer, which reads
`<hidden-states-path>/hs_{i}.safetensors`, and checks it with data_generation.offline.check_hidden_states.)

A file appears under its final name only once complete (temp name, fsync, rename), so a reader
or a resumed run never sees half a file; `verify_header` checks what a killed or foreign writer
left behind without reading the tensors.
"""

from __future__ import annotations

import json
import os
import queue
import struct
import threading
from collections.abc import Callable
from pathlib import Path

SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "int64": "I64"}
TEMP_PREFIX = ".hs_"


def file_for(folder: Path, index: int) -> Path:
    return folder / f"hs_{index}.safetensors"


def index_of(path: Path) -> int | None:
    stem = path.name.removesuffix(".safetensors")
    if not path.name.endswith(".safetensors") or not stem.startswith("hs_") or not stem[3:].isdigit():
        return None
    return int(stem[3:])


def write_sample(folder: Path, index: int, token_ids, hidden_states) -> int:
    """Write one sample atomically; returns the bytes written."""
    from safetensors.torch import save_file

    target = file_for(folder, index)
    temp = folder / f"{TEMP_PREFIX}{index}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        save_file({"token_ids": token_ids, "hidden_states": hidden_states}, str(temp))
        with temp.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return target.stat().st_size


def remove_temporaries(folder: Path) -> int:
    """Temp files of writers that were killed: never trusted, never completed."""
    removed = 0
    if folder.is_dir():
        for stray in folder.glob(f"{TEMP_PREFIX}*.tmp"):
            stray.unlink(missing_ok=True)
            removed += 1
    return removed


def verify_header(path: Path, seq_len: int, n_layers: int, hidden: int, dtype: str) -> str | None:
    """None if the file's header promises exactly the expected tensors, else what is wrong.

    Checks the keys, dtypes and shapes in the header and that the file is exactly as long as the
    header says: a truncated or padded file fails without reading any tensor data.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                return "shorter than a safetensors header"
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > min(size, 100_000_000):
                return "header length beyond the file"
            header = json.loads(handle.read(header_len))
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError) as exc:
        return f"unreadable header ({type(exc).__name__})"
    header.pop("__metadata__", None)
    if set(header) != {"token_ids", "hidden_states"}:
        return f"keys are {sorted(header)}, expected ['hidden_states', 'token_ids']"
    expected = {"token_ids": ("I64", [seq_len]),
                "hidden_states": (SAFETENSORS_DTYPES.get(dtype, dtype), [seq_len, n_layers, hidden])}
    end = 0
    for key, (want_dtype, want_shape) in expected.items():
        entry = header[key]
        if entry.get("dtype") != want_dtype:
            return f"{key} dtype is {entry.get('dtype')}, expected {want_dtype}"
        if entry.get("shape") != want_shape:
            return f"{key} shape is {entry.get('shape')}, expected {want_shape}"
        end = max(end, entry["data_offsets"][1])
    if size != 8 + header_len + end:
        return f"file is {size} bytes, header promises {8 + header_len + end}"
    return None


class BackgroundWriter:
    """Runs write jobs on a few threads behind a bounded queue, so compute is not held up by disk.

    The bound keeps memory in check: when writers fall behind, `submit` blocks the producer.
    The first error of any job is raised by `submit` or `close`.
    """

    def __init__(self, threads: int = 1, depth: int = 4) -> None:
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._threads = [threading.Thread(target=self._work, daemon=True, name=f"hs-writer-{n}")
                         for n in range(threads)]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                if self._error is None:
                    job()
            except BaseException as exc:
                self._error = exc
            finally:
                self._queue.task_done()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, job: Callable[[], None]) -> None:
        self._raise()
        self._queue.put(job)

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()
        self._raise()
