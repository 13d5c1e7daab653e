"""Hidden-state files as speculators 0.9 reads them, written atomically by background threads.

One file per prepared sample i: `hs_{i}.safetensors` holding
    token_ids      int64 [seq]
    hidden_states  model dtype [seq, n_layers, hidden]   (last slice = final layer, pre-norm)
(speculators.train.data.ArrowDataset loads it through hs_connectors.FileTransfer, which reads
`<hidden-states-path>/hs_{i}.safetensors`, and checks it with data_generation.offline.check_hidden_states.)

With `hidden_states.backend: fp8` the same file holds hidden_states as float8_e4m3fn and a third tensor,
    hidden_states_scales  float32 [seq, 1, 1]   (one scale per token over all layers and the hidden size)
as speculators' hs_connectors writes it (FP8HiddenStatesConnector, fp8_utils.quantize_tensor_to_fp8) and reads it
back dequantised (FP8Transfer); `read_sample` reads through those same classes.

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

SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "int64": "I64",
                      "float8_e4m3fn": "F8_E4M3"}
TEMP_PREFIX = ".hs_"
FP8 = "float8_e4m3fn"  # the stored dtype of backend fp8's hidden states
SCALES_KEY = "hidden_states_scales"  # hs_connectors.fp8_utils.SCALES_KEY (the face stays free of torch)


def stored_dtype(dtype: str, backend: str | None) -> str:
    """The dtype a row's hidden_states tensor has in its file: the model's, or fp8 for backend fp8."""
    return FP8 if backend == "fp8" else dtype


def inputs_backend(inputs: dict) -> str:
    """The hidden-states backend an extract record's inputs name (absent: file, as before backends existed)."""
    return inputs.get("hidden_states_backend", "file")


def read_sample(folder: Path, index: int, backend: str = "file", dtype=None) -> dict:
    """Row `index`'s tensors as the trainer reads them: through speculators' own hs_connectors transfer
    (FileTransfer, or FP8Transfer dequantising to `dtype`, default float32, and dropping the scales)."""
    from hs_connectors import FileTransfer, FP8Transfer

    if backend == "fp8":
        import torch

        transfer = FP8Transfer(folder, dequantize_dtype=dtype or torch.float32)
    else:
        transfer = FileTransfer(folder)
    sample = transfer.get_cached(index)
    if sample is None:
        raise FileNotFoundError(str(file_for(folder, index)))
    return sample


def file_for(folder: Path, index: int) -> Path:
    return folder / f"hs_{index}.safetensors"


def index_of(path: Path) -> int | None:
    stem = path.name.removesuffix(".safetensors")
    if not path.name.endswith(".safetensors") or not stem.startswith("hs_") or not stem[3:].isdigit():
        return None
    return int(stem[3:])


def write_sample(folder: Path, index: int, token_ids, hidden_states, fp8: bool = False) -> int:
    """Write one sample atomically; returns the bytes written. fp8: quantised as hs_connectors' FP8 connector
    does (its own quantize_tensor_to_fp8: per-token scales)."""
    from safetensors.torch import save_file

    tensors = {"token_ids": token_ids, "hidden_states": hidden_states}
    if fp8:
        from hs_connectors.fp8_utils import quantize_tensor_to_fp8

        tensors["hidden_states"], tensors[SCALES_KEY] = quantize_tensor_to_fp8(hidden_states)
    target = file_for(folder, index)
    temp = folder / f"{TEMP_PREFIX}{index}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        save_file(tensors, str(temp))
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
    expected = {"token_ids": ("I64", [seq_len]),
                "hidden_states": (SAFETENSORS_DTYPES.get(dtype, dtype), [seq_len, n_layers, hidden])}
    if dtype == FP8:
        expected[SCALES_KEY] = ("F32", [seq_len, 1, 1])
    if set(header) != set(expected):
        return f"keys are {sorted(header)}, expected {sorted(expected)}"
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
