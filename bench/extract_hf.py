"""Benchmark of the hf extraction backend against the GPU's compute limit and the disk's write rate.

    PYTHONPATH=src python bench/extract_hf.py --out DIR          # H200: Llama-3.1-8B dimensions, bf16
    PYTHONPATH=src python bench/extract_hf.py --out DIR --tiny   # CPU smoke run, tiny dimensions
    PYTHONPATH=src python bench/extract_hf.py --out DIR --stages --before OLD.py   # where the time goes

--stages adds passes that each add one part of the extractor to the bare forward (the all-ones
attention mask it used to pass, the capture hooks, the device-to-host copy, the page-locked buffers
allocated as it used to), and --before FILE also runs the Extractor class of an older
extract_hf.py (e.g. `git show REV:src/specops/pipeline/extract_hf.py > OLD.py`) on the same
batches, so before and after print side by side.

Builds a Llama with random weights (on the meta device, then to_empty on the target device and a
fast normal_ init, so it starts in seconds; no download), then measures on random token ids:
  bare forward     the decoder forward alone (no capture, nothing leaves the device)
  extractor        specops' capture hooks + pinned host copies + background atomic writes (fsync)
  compute limit    2 x matmul parameters x tokens / peak FLOP/s, as tokens/s
  disk             safetensors files of one sample's size written with fsync, GB/s, against the
                   hidden-state byte rate the extractor needs at bare-forward speed
and prints them side by side as ratios (also written to DIR/bench.json). Prints ratios, asserts
nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from specops.pipeline.extraction import BackgroundWriter, write_sample
from specops.pipeline.extraction.hf import Extractor, plan_batches

PEAK_FLOPS = 790e12  # H200 dense bf16, as the issue asks

LLAMA_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192)
TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2, head_dim=32,
            intermediate_size=128, vocab_size=512, max_position_embeddings=1024)


def build_model(dims: dict, device: torch.device, dtype: torch.dtype):
    """The generator of `specops tiny --shape 8b` (normal(0, 0.02), unit norms, made on the device)."""
    from transformers import LlamaConfig

    from specops.pipeline.data.tiny import random_llama

    config = LlamaConfig(**dims, tie_word_embeddings=False, initializer_range=0.02)
    return random_llama(config, device, dtype, seed=0)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def bare_forward(model, batches: list[torch.Tensor], device: torch.device) -> float:
    decoder = model.model
    with torch.inference_mode():
        decoder(input_ids=batches[0].to(device), use_cache=False)  # warm-up
        synchronize(device)
        started = time.perf_counter()
        for batch in batches:
            decoder(input_ids=batch.to(device), use_cache=False)
        synchronize(device)
    return time.perf_counter() - started


def extractor_run(model, tokens: torch.Tensor, batch_tokens: int, layer_ids: list[int], out: Path,
                  device: torch.device, dtype: torch.dtype, writers: int, extractor_class=Extractor) -> float:
    folder = out / "hidden_states"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    samples = tokens.tolist()
    plan = plan_batches([len(row) for row in samples], batch_tokens)
    writer = BackgroundWriter(threads=writers, depth=2)
    if extractor_class is Extractor:
        extractor = Extractor(model, layer_ids, model.config.hidden_size, device, dtype, writer, batch_tokens)
    else:  # an older version, constructed as it was
        extractor = extractor_class(model, layer_ids, model.config.hidden_size, device, dtype, writer)
    extractor.extract(plan[0], [samples[i] for i in plan[0]], set(), folder)  # warm-up, writes nothing
    wanted = set(range(len(samples)))
    synchronize(device)
    started = time.perf_counter()
    try:
        for batch in plan:
            extractor.extract(batch, [samples[i] for i in batch], wanted, folder)
    finally:
        writer.close()
        extractor.capture.remove()
    elapsed = time.perf_counter() - started
    written = len(list(folder.glob("hs_*.safetensors")))
    if written != len(samples):
        raise SystemExit(f"extractor wrote {written} files for {len(samples)} samples")
    return elapsed


def load_extractor_class(path: Path):
    spec = importlib.util.spec_from_file_location("extract_hf_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.Extractor


def stage_passes(model, batches: list[torch.Tensor], layer_ids: list[int], device: torch.device,
                 dtype: torch.dtype) -> dict[str, float]:
    """Seconds of one pass over the batches per stage, each stage adding one part of the extractor."""
    from specops.pipeline.extraction.hf import LayerCapture

    decoder = model.model
    hidden = model.config.hidden_size
    capture = LayerCapture(model, layer_ids)
    shape = (batches[0].shape[0], batches[0].shape[1], len(layer_ids), hidden)
    numel = shape[0] * shape[1] * shape[2] * shape[3]
    pinned = [torch.empty(numel, dtype=dtype, pin_memory=True) for _ in range(2)]
    copy_stream = torch.cuda.Stream()

    def one_pass(mask: bool, hooks: bool, copy: str | None) -> float:
        capture.buffer = torch.empty(shape, dtype=dtype, device=device) if hooks else None
        if not hooks:
            capture.remove()
        synchronize(device)
        started = time.perf_counter()
        for number, batch in enumerate(batches):
            inputs = {"attention_mask": torch.ones(batch.shape, dtype=torch.long).to(device)} if mask else {}
            if hooks:
                capture.buffer = torch.empty((*batch.shape, len(layer_ids), hidden), dtype=dtype, device=device)
            decoder(input_ids=batch.to(device), use_cache=False, **inputs)
            if copy is None:
                continue
            if copy == "pageable-pin":  # what the old lazy growth did for each of its first buffers
                host = torch.empty(capture.buffer.numel(), dtype=dtype).pin_memory()
            else:
                host = pinned[number % 2]
            host = host[: capture.buffer.numel()].view(capture.buffer.shape)
            if copy == "side-stream":
                copy_stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(copy_stream):
                    host.copy_(capture.buffer, non_blocking=True)
                capture.buffer.record_stream(copy_stream)
            else:
                host.copy_(capture.buffer, non_blocking=True)
        synchronize(device)
        return time.perf_counter() - started

    results = {}
    with torch.inference_mode():
        capture.buffer = torch.empty((*batches[0].shape, len(layer_ids), hidden), dtype=dtype, device=device)
        decoder(input_ids=batches[0].to(device), use_cache=False)  # warm-up
        for name, mask, hooks, copy in (
                ("bare forward (again)", False, False, None),
                ("+ all-ones attention mask", True, False, None),
                ("capture hooks, no mask", False, True, None),
                ("+ copy on the compute stream", False, True, "same-stream"),
                ("+ copy on a copy stream", False, True, "side-stream"),
                ("+ new pinned buffer per batch (old growth)", False, True, "pageable-pin")):
            if hooks and not capture._handles:
                capture = LayerCapture(model, layer_ids)
            results[name] = one_pass(mask, hooks, copy)
    capture.remove()
    started = time.perf_counter()
    torch.empty(numel, dtype=dtype).pin_memory()
    results["one .pin_memory() of a batch buffer"] = time.perf_counter() - started
    started = time.perf_counter()
    torch.empty(numel, dtype=dtype, pin_memory=True)
    results["one empty(pin_memory=True) of a batch buffer"] = time.perf_counter() - started
    return results


def disk_rate(out: Path, seq_len: int, layers: int, hidden: int, dtype: torch.dtype, files: int) -> float:
    """Bytes/s of safetensors files of one sample's size written with fsync, one after another."""
    folder = out / "disk"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    states = torch.randn(seq_len, layers, hidden).to(dtype)
    token_ids = torch.zeros(seq_len, dtype=torch.int64)
    started = time.perf_counter()
    total = sum(write_sample(folder, index, token_ids, states) for index in range(files))
    elapsed = time.perf_counter() - started
    shutil.rmtree(folder, ignore_errors=True)
    return total / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="scratch folder on the disk under test")
    parser.add_argument("--tiny", action="store_true", help="tiny dimensions on the CPU (smoke run)")
    parser.add_argument("--samples", type=int, help="samples per measurement (default 384, tiny 16; the last "
                        "batch's writes, ~0.4 s at 8B, are a fixed cost of every run: 96 samples made it 7%%)")
    parser.add_argument("--seq-len", type=int, help="tokens per sample (default 2048, tiny 256)")
    parser.add_argument("--batch-tokens", type=int, help="padded tokens per batch (default 16384, tiny 1024)")
    parser.add_argument("--writers", type=int, default=2, help="writer threads")
    parser.add_argument("--peak-flops", type=float, default=PEAK_FLOPS)
    parser.add_argument("--stages", action="store_true", help="also time the extractor's parts one by one (GPU)")
    parser.add_argument("--before", type=Path, help="an older extract_hf.py whose Extractor also runs")
    args = parser.parse_args()

    tiny = args.tiny or not torch.cuda.is_available()
    if not args.tiny and tiny:
        print("no GPU: running the tiny CPU variant", file=sys.stderr)
    device = torch.device("cpu" if tiny else "cuda")
    dtype = torch.float32 if tiny else torch.bfloat16
    dims = TINY if tiny else LLAMA_8B
    samples = args.samples or (16 if tiny else 384)
    seq_len = args.seq_len or (256 if tiny else 2048)
    batch_tokens = max(args.batch_tokens or (1024 if tiny else 16384), seq_len)
    layers = dims["num_hidden_layers"]
    layer_ids = [1, layers // 2, layers - 1, layers] if tiny else [2, layers // 2, layers - 3, layers]
    args.out.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    model = build_model(dims, device, dtype)
    synchronize(device)
    print(f"model built in {time.perf_counter() - started:.1f}s on {device}", file=sys.stderr)
    matmul_params = sum(p.numel() for n, p in model.model.named_parameters() if "embed_tokens" not in n)

    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, dims["vocab_size"], (samples, seq_len), generator=generator)
    rows = max(1, batch_tokens // seq_len)
    batches = [tokens[i: i + rows] for i in range(0, samples, rows)]
    total_tokens = samples * seq_len

    run = lambda cls=Extractor: extractor_run(model, tokens, batch_tokens, layer_ids, args.out,  # noqa: E731
                                              device, dtype, args.writers, cls)
    # ABBA order (bare, after, before, before, after, bare): drift over the run hits all alike
    bare_runs = [bare_forward(model, batches, device)]
    extract_runs = [run()]
    before_runs = []
    if args.before:
        before_class = load_extractor_class(args.before)
        before_runs = [run(before_class), run(before_class)]
        extract_runs.append(run())
    bare_runs.append(bare_forward(model, batches, device))
    bare_s, extract_s = sum(bare_runs) / len(bare_runs), sum(extract_runs) / len(extract_runs)
    before_s = sum(before_runs) / len(before_runs) if before_runs else None
    print(f"passes (s): bare {bare_runs}, extractor {extract_runs}, before {before_runs}", file=sys.stderr)
    stages = stage_passes(model, batches, layer_ids, device, dtype) if args.stages and device.type == "cuda" else {}
    hidden = dims["hidden_size"]
    bytes_per_token = len(layer_ids) * hidden * dtype.itemsize + 8
    disk_bps = disk_rate(args.out, seq_len, len(layer_ids), hidden, dtype, files=max(4, min(samples, 24)))

    bare_tps, extract_tps = total_tokens / bare_s, total_tokens / extract_s
    limit_tps = args.peak_flops / (2 * matmul_params)
    need_bps = bare_tps * bytes_per_token
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "dims": dims, "dtype": str(dtype), "samples": samples, "seq_len": seq_len, "batch_tokens": batch_tokens,
        "layer_ids": layer_ids, "matmul_params": matmul_params, "peak_flops": args.peak_flops,
        "bare_tokens_per_s": bare_tps, "extractor_tokens_per_s": extract_tps,
        "compute_limit_tokens_per_s": limit_tps, "disk_write_gb_per_s": disk_bps / 1e9,
        "needed_write_gb_per_s_at_bare_speed": need_bps / 1e9,
        "extractor_write_gb_per_s": extract_tps * bytes_per_token / 1e9,
        "ratios": {"extractor_vs_bare": extract_tps / bare_tps, "bare_vs_compute_limit": bare_tps / limit_tps,
                   "extractor_vs_compute_limit": extract_tps / limit_tps, "disk_vs_needed": disk_bps / need_bps},
    }
    if before_s is not None:
        result["before_extractor_tokens_per_s"] = total_tokens / before_s
        result["ratios"]["before_extractor_vs_bare"] = bare_s / before_s
    result["stages_s"] = stages
    result["passes_s"] = {"bare": bare_runs, "extractor": extract_runs, "before": before_runs}
    (args.out / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    shutil.rmtree(args.out / "hidden_states", ignore_errors=True)

    print(f"{'':28}{'tokens/s':>14}{'vs compute limit':>18}")
    print(f"{'compute limit':28}{limit_tps:14,.0f}{1.0:18.2f}")
    print(f"{'bare forward':28}{bare_tps:14,.0f}{bare_tps / limit_tps:18.2f}")
    print(f"{'extractor (capture+write)':28}{extract_tps:14,.0f}{extract_tps / limit_tps:18.2f}")
    if before_s is not None:
        before_tps = total_tokens / before_s
        print(f"{'extractor before (--before)':28}{before_tps:14,.0f}{before_tps / limit_tps:18.2f}")
        print(f"extractor before / bare forward: {bare_s / before_s:.3f}")
    print(f"extractor / bare forward:  {extract_tps / bare_tps:.3f}")
    if stages:
        print(f"stages ({len(batches)} batches of {rows} x {seq_len}; seconds, and x bare forward):")
        for name, seconds in stages.items():
            relative = f"{seconds / bare_s:8.3f}x" if not name.startswith("one ") else ""
            print(f"  {name:46}{seconds:8.3f}s {relative}")
    print(f"disk write with fsync:     {disk_bps / 1e9:.2f} GB/s; needed at bare speed {need_bps / 1e9:.2f} GB/s "
          f"-> disk / needed = {disk_bps / need_bps:.2f} ({'IO-bound' if disk_bps < need_bps else 'compute-bound'})")
    print(f"total {time.perf_counter() - started:.1f}s; details in {args.out / 'bench.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
