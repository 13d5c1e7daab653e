"""The extract step with the `hf` backend: an in-process transformers forward with captured layers.

Capture convention (the one vLLM serving uses for EAGLE-3, `eagle_aux_hidden_state_layer_ids`):
layer id i < n is the hidden state ENTERING decoder layer i (the residual stream after layers
0..i-1; id 0 is the embedding output), and id n (= the number of decoder layers) is the residual
stream after the last layer, BEFORE the final norm. Forward pre-hooks on the decoder layers and on
the final norm capture exactly these; `output_hidden_states` is not used because transformers
puts the post-norm state in its last element.

Work is planned in batches of similar length (sorted within fixed windows of rows, so a row's
batch never depends on how many samples were asked for or what was already done: a resumed run
writes the same bytes as an uninterrupted one). Batches run on the GPU when there is one (bf16),
else on the CPU; finished batches go to background writer threads through a bounded queue.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput
from specops.host import atomic
from specops.pipeline.extraction.hidden_states import BackgroundWriter, write_sample
from specops.pipeline.extraction.plan import backend_input, plan_extraction, prepared_rows, rows_to_extract
from specops.pipeline.target import choose_device, decoder_parts, load_target

if TYPE_CHECKING:  # run configs need pydantic, which the bench's bare GPU image may lack
    import datasets
    import torch

    from specops.pipeline.run import Run, StepReport

WINDOW_ROWS = 256  # rows sorted by length together; bounds the work done for a small --samples
GPU_BATCH_TOKENS = 16384
CPU_BATCH_TOKENS = 2048
MAX_BATCH_ROWS = 64


class LayerCapture:
    """Forward pre-hooks that copy the state entering each chosen layer into one buffer.

    The copy happens at capture time (into buffer[:, :, slot]): a model that later changes its
    residual tensor in place cannot change what was captured, and no stacking pass is needed.
    """

    def __init__(self, model: torch.nn.Module, layer_ids: list[int]) -> None:
        self.decoder, layers, norm = decoder_parts(model)
        count = len(layers)
        if max(layer_ids) > count:
            raise BadInput(f"layer_ids: {max(layer_ids)} is beyond the model's {count} layers")
        self.buffer: Any = None
        self._handles = []
        for slot, layer_id in enumerate(layer_ids):
            module = layers[layer_id] if layer_id < count else norm
            self._handles.append(module.register_forward_pre_hook(self._hook(slot), with_kwargs=True))

    def _hook(self, slot: int):
        def capture(_module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            state = args[0] if args else kwargs["hidden_states"]
            self.buffer[:, :, slot].copy_(state)
        return capture

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


class Extractor:
    """Runs batches through the decoder and hands the captured states to the writer threads.

    On the GPU the states go to a few page-locked host buffers allocated once, at the largest
    batch's size when it is known: page-locking ~0.5 GB costs ~26 ms on an H200 host, and buffers
    grown batch by batch paid it (plus a pageable copy) inside the first batches of every run.
    """

    PINNED_BUFFERS = 3  # one being filled, one being written, one spare

    def __init__(self, model: torch.nn.Module, layer_ids: list[int], hidden_size: int, device: torch.device,
                 dtype: torch.dtype, writer: BackgroundWriter, batch_tokens: int | None = None,
                 fp8: bool = False) -> None:
        import torch

        self.fp8 = fp8  # backend fp8: files quantised as hs_connectors' FP8 connector writes them
        self.torch = torch
        self.capture = LayerCapture(model, layer_ids)
        self.layers, self.hidden, self.device, self.dtype = len(layer_ids), hidden_size, device, dtype
        self.writer = writer
        self.cuda = device.type == "cuda"
        self._pinned: Any = None  # queue of reusable page-locked host buffers (GPU only)
        if self.cuda and batch_tokens:
            self._allocate_pinned(batch_tokens * self.layers * self.hidden)

    def forward(self, token_lists: list[list[int]]) -> torch.Tensor:
        """Captured states [batch, longest, n_layers, hidden] on the device (right-padded)."""
        torch = self.torch
        rows, longest = len(token_lists), max(len(tokens) for tokens in token_lists)
        input_ids = torch.zeros((rows, longest), dtype=torch.long)
        attention = torch.zeros((rows, longest), dtype=torch.long)
        for row, tokens in enumerate(token_lists):
            input_ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            attention[row, : len(tokens)] = 1
        self.capture.buffer = torch.empty((rows, longest, self.layers, self.hidden), dtype=self.dtype,
                                          device=self.device)
        with torch.inference_mode():
            self.capture.decoder(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device),
                                 use_cache=False)
        buffer, self.capture.buffer = self.capture.buffer, None
        return buffer

    def _allocate_pinned(self, numel: int) -> None:
        import queue

        self._pinned = queue.Queue()
        for _ in range(self.PINNED_BUFFERS):  # pin_memory=True: no pageable copy made first
            self._pinned.put(self.torch.empty(numel, dtype=self.dtype, pin_memory=True))

    def _host_copy(self, buffer: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None, Callable[[], None]]:
        """(host tensor, event to wait on, release callback): pinned async copies on the GPU."""
        if not self.cuda:
            return buffer, None, lambda: None
        torch = self.torch
        if self._pinned is None:
            self._allocate_pinned(buffer.numel())
        pinned = self._pinned.get()  # blocks while all buffers are being written out
        if pinned.numel() < buffer.numel():  # a batch beyond the planned size (not in extract())
            pinned = torch.empty(buffer.numel(), dtype=self.dtype, pin_memory=True)
        host = pinned[: buffer.numel()].view(buffer.shape)
        host.copy_(buffer, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return host, event, lambda: self._pinned.put(pinned)

    def extract(self, indices: list[int], token_lists: list[list[int]], wanted: set[int], folder: Path,
                on_written: Callable[[int, int], None] | None = None) -> None:
        buffer = self.forward(token_lists)
        host, event, release = self._host_copy(buffer)
        torch = self.torch

        def write_batch() -> None:
            try:
                if event is not None:
                    event.synchronize()
                for row, (index, tokens) in enumerate(zip(indices, token_lists, strict=True)):
                    if index not in wanted:
                        continue
                    size = write_sample(folder, index, torch.tensor(tokens, dtype=torch.int64),
                                        host[row, : len(tokens)], fp8=self.fp8)
                    if on_written is not None:
                        on_written(len(tokens), size)
            finally:
                release()

        self.writer.submit(write_batch)


def plan_batches(lengths: list[int], batch_tokens: int, window: int = WINDOW_ROWS) -> list[list[int]]:
    """Row indices grouped into batches of similar length, at most batch_tokens padded tokens each.

    Rows are sorted by (length, index) inside consecutive windows of `window` rows; the plan of a
    window depends only on that window's lengths.
    """
    batches: list[list[int]] = []
    for start in range(0, len(lengths), window):
        rows = sorted(range(start, min(start + window, len(lengths))), key=lambda i: (lengths[i], i))
        current: list[int] = []
        for row in rows:  # ascending length: the newest row is the longest in its batch
            if current and ((len(current) + 1) * lengths[row] > batch_tokens or len(current) >= MAX_BATCH_ROWS):
                batches.append(current)
                current = []
            current.append(row)
        if current:
            batches.append(current)
    return batches


@dataclass
class Progress:
    path: Path
    total_samples: int
    total_tokens: int
    done_samples: int = 0
    done_tokens: int = 0
    written_bytes: int = 0
    _started: float = 0.0
    _last_report: float = 0.0

    def start(self) -> None:
        self._started = self._last_report = time.monotonic()
        self.report(force=True)

    def add(self, tokens: int, size: int) -> None:
        self.done_samples += 1
        self.done_tokens += tokens
        self.written_bytes += size
        self.report()

    def document(self, state: str) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        rate = self.done_tokens / elapsed
        remaining = self.total_tokens - self.done_tokens
        return {"state": state, "done": self.done_samples, "total": self.total_samples,
                "tokens_done": self.done_tokens, "tokens_total": self.total_tokens,
                "samples_per_s": round(self.done_samples / elapsed, 3), "tokens_per_s": round(rate, 1),
                "write_mb_per_s": round(self.written_bytes / elapsed / 1e6, 2),
                "eta_s": round(remaining / rate, 1) if rate > 0 else None,
                "elapsed_s": round(elapsed, 2), "updated_at": time.time()}

    def report(self, force: bool = False, state: str = "running") -> None:
        now = time.monotonic()
        if not force and now - self._last_report < 1.0:
            return
        self._last_report = now
        document = self.document(state)
        atomic.write_json(self.path, document)
        eta = f"{document['eta_s']:.0f}s" if document["eta_s"] is not None else "?"
        print(f"extract: {self.done_samples}/{self.total_samples} samples, {document['samples_per_s']} samples/s, "
              f"{document['tokens_per_s']} tokens/s, ETA {eta}", file=sys.stderr, flush=True)


def extract_inputs(run: Run, prepare_hash: str, device: torch.device, dtype: torch.dtype,
                   batch_tokens: int) -> dict[str, Any]:
    from specops.pipeline.run import model_digest

    return {"prepare": prepare_hash, "model": run.config.model, "model_digest": model_digest(run.model_path),
            "layer_ids": run.layer_ids(), "dtype": str(dtype).removeprefix("torch."), "device": device.type,
            "batch_tokens": batch_tokens, "window": WINDOW_ROWS, "backend": "hf",
            # only when not file: runs extracted before backends existed keep their hash
            **backend_input(run)}


def extract(run: Run, samples: int | None, batch_tokens: int | None = None, processes: int | None = None, *,
            part: tuple[int, int] | None = None, require_whole: bool = False) -> StepReport:
    """Run (or resume, or skip) the extract step for the first `samples` prepared rows.

    processes: how many processes share the work, one per GPU (default: every GPU on a GPU host,
    one on the CPU); the files are the same bytes whatever the count (hf_shards).
    part (I, COUNT): one host's share of a run spread over COUNT hosts: the batches of share I of the
    one-host plan (hf_shards.host_share), so every file is the bytes one host would write; the step is
    recorded as a part, not done, until a `require_whole` run finds all N files whole.
    require_whole: write nothing; exit 1 naming the first file of rows 0..N-1 that is not whole."""
    from specops.pipeline.extraction.hf_shards import host_share
    from specops.pipeline.run import ExtractCounts

    prepare_hash, lengths = prepared_rows(run, samples)
    device, dtype = choose_device(run.config.dtype)
    batch_tokens = batch_tokens or (GPU_BATCH_TOKENS if device.type == "cuda" else CPU_BATCH_TOKENS)
    batch_tokens = max(batch_tokens, max(lengths))
    inputs = extract_inputs(run, prepare_hash, device, dtype, batch_tokens)
    count = rows_to_extract(run, lengths, inputs["dtype"], _gpu_count(device))
    plan = plan_extraction(run, lengths, count, inputs)
    if require_whole:
        plan.require_all_whole()
    batches = plan_batches(lengths, batch_tokens)
    share, share_rows = host_share(plan, batches, part) if part else (None, set())
    if plan.unchanged:
        return {**plan.skipped(), "output": str(plan.folder), **({"part": share} if share else {})}

    with plan.recorded() as (outcome, rows):
        todo, folder = set(rows), plan.folder
        if share:
            todo &= share_rows
        batches = [batch for batch in batches if todo.intersection(batch)]
        progress = Progress(run.paths.progress, len(todo), sum(lengths[i] for i in todo))
        processes = min(processes or _gpu_processes(device), max(len(batches), 1))
        if todo and processes > 1:
            from specops.pipeline.extraction.hf_shards import run_shards

            run_shards(run, batches, todo, plan.layer_ids, plan.hidden, processes, device.type == "cuda", progress,
                       batch_tokens)
            atomic.fsync_dir(folder)
        elif todo:
            import datasets  # only to extract: a skip reads the rows' lengths with pyarrow (data.saved)

            dataset = datasets.load_from_disk(str(run.paths.prepared)).with_format(None)
            run_batches(run, dataset, batches, todo, folder, device, dtype, plan.layer_ids, plan.hidden, progress,
                        batch_tokens)
        else:
            progress.start()
        progress.report(force=True, state="done")
        # "samples": rows 0 .. count-1 are now whole on disk (a part: this host's share of them)
        counts = ExtractCounts(samples=share["rows"] if share else count, written=len(todo),
                               regenerated=len(plan.regenerated), tokens_written=progress.done_tokens,
                               bytes_written=progress.written_bytes)
        status = f"part {share['index']} of {share['count']}" if share else "done"
        outcome.counts, outcome.status = counts, status
    return {"step": "extract", "status": status, "inputs_hash": plan.inputs_hash, "counts": counts,
            "layer_ids": plan.layer_ids, "device": device.type, "dtype": plan.dtype,
            "seconds": outcome.record["seconds"],
            "progress": progress.document("done"), "output": str(folder), "processes": processes,
            **({"part": share} if share else {})}


def _gpu_count(device: torch.device) -> int:
    """GPUs of the host as the trainer sees them (0 on a CPU host)."""
    from specops.host import gpus

    return gpus.device_count() if device.type == "cuda" else 0


def _gpu_processes(device: torch.device) -> int:
    """One process per visible GPU on a GPU host, one on the CPU."""
    if device.type != "cuda":
        return 1
    import torch

    return max(torch.cuda.device_count(), 1)


def run_batches(run: Run, dataset: datasets.Dataset, batches: list[list[int]], todo: set[int], folder: Path,
                device: torch.device, dtype: torch.dtype, layer_ids: list[int], hidden: int, progress: Progress,
                batch_tokens: int) -> None:
    """Run `batches` in this process, writing the files of the rows in `todo`."""
    model = load_target(run, device, dtype)
    writer = BackgroundWriter(threads=2 if device.type == "cuda" else 1, depth=2)
    extractor = Extractor(model, layer_ids, hidden, device, dtype, writer, batch_tokens,
                          fp8=run.config.hidden_states.backend == "fp8")
    progress.start()  # after loading the model: rates and ETA are of the extraction itself
    lock = threading.Lock()

    def written(tokens: int, size: int) -> None:
        with lock:
            progress.add(tokens, size)

    try:
        for batch in batches:
            token_lists = [list(dataset[index]["input_ids"]) for index in batch]
            extractor.extract(batch, token_lists, todo, folder, written)
    finally:
        writer.close()
        extractor.capture.remove()
    atomic.fsync_dir(folder)


def extract_shard(run: Run, shard: int) -> dict[str, Any]:
    """One process's part: its batches of the cut the parent wrote, on this process's device."""
    import datasets

    from specops.pipeline.extraction.hf_shards import SHARDS_FILE, shard_progress_file

    try:
        plan = json.loads((run.paths.run_dir / SHARDS_FILE).read_text())
    except (OSError, ValueError):
        raise BadInput(f"{run.paths.run_dir / SHARDS_FILE}: no shard plan (the extract step writes it)") from None
    if not 0 <= shard < len(plan["shards"]):
        raise BadInput(f"--shard: {shard} is not one of the plan's {len(plan['shards'])} shards")
    batches, todo = plan["shards"][shard], set(plan["todo"])
    device, dtype = choose_device(run.config.dtype)
    lengths = {index: 0 for batch in batches for index in batch}
    dataset = datasets.load_from_disk(str(run.paths.prepared)).with_format(None)
    for index in lengths:
        lengths[index] = int(dataset[index]["seq_len"])
    mine = [index for index in lengths if index in todo]
    progress = Progress(shard_progress_file(run, shard), len(mine), sum(lengths[index] for index in mine))
    if batches:
        run_batches(run, dataset, batches, todo, run.paths.hidden_states, device, dtype, plan["layer_ids"],
                    plan["hidden"], progress, plan["batch_tokens"])
    progress.report(force=True, state="done")
    return {"shard": shard, "batches": len(batches), "written": progress.done_samples,
            "tokens": progress.done_tokens, "device": device.type}
