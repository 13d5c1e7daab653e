"""hf extraction on 1 GPU against N GPUs (default 2) on disjoint row ranges: tokens/s side by side,
and every hidden-state file of the N-GPU run compared byte for byte with the 1-GPU run's.

Same model and inputs as bench/extract_hf.py (Llama-3.1-8B dimensions, random weights from a fixed
seed, random token ids, sequences of 2048, 16384 padded tokens per batch). The rows are planned
once with specops' planner (plan_batches); GPU r takes the batches whose rows lie in the r-th of N
equal row ranges, so every row lands in the same batch as on one GPU and its file must be
identical. Each GPU is its own process (CUDA_VISIBLE_DEVICES=r), running specops' Extractor with
its pinned buffers and writer threads; the processes build their models first, then start together,
and the N-GPU time runs from the first start to the last finish. The issue asks for a ratio >= 1.9.

    source bench/device_setup.sh && PYTHONPATH=/tmp/site:src python3 bench/extract_multi_gpu.py --out /tmp/xm
    PYTHONPATH=src python bench/extract_multi_gpu.py --out /tmp/xm --tiny     # CPU smoke run (N processes)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import extract_hf as single


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="scratch folder (two runs' files live here)")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--samples", type=int, help="rows (default 192, tiny 32)")
    parser.add_argument("--seq-len", type=int, help="default 2048, tiny 128")
    parser.add_argument("--batch-tokens", type=int, help="default 16384, tiny 512")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # internal: this process's rank
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    return parser.parse_args()


def settings(args: argparse.Namespace) -> tuple[dict, int, int, int]:
    dims = single.TINY if args.tiny else single.LLAMA_8B
    samples = args.samples or (32 if args.tiny else 192)
    seq_len = args.seq_len or (128 if args.tiny else 2048)
    return dims, samples, seq_len, max(args.batch_tokens or (512 if args.tiny else 16384), seq_len)


def worker(args: argparse.Namespace) -> None:
    """One GPU's share: build the model, wait for the go file, extract its batches, report times."""
    import torch

    from specops.pipeline.extraction import BackgroundWriter
    from specops.pipeline.extraction.hf import Extractor, plan_batches

    dims, samples, seq_len, batch_tokens = settings(args)
    tiny = args.tiny or not torch.cuda.is_available()
    device = torch.device("cpu" if tiny else "cuda")
    dtype = torch.float32 if tiny else torch.bfloat16
    model = single.build_model(dims, device, dtype)
    layers = dims["num_hidden_layers"]
    layer_ids = [1, layers // 2, layers - 1, layers] if tiny else [2, layers // 2, layers - 3, layers]
    tokens = torch.randint(0, dims["vocab_size"], (samples, seq_len), generator=torch.Generator().manual_seed(0))
    rows = tokens.tolist()
    low, high = args.worker * samples // args.world, (args.worker + 1) * samples // args.world
    mine = [batch for batch in plan_batches([len(row) for row in rows], batch_tokens) if low <= batch[0] < high]
    if any(not low <= row < high for batch in mine for row in batch):
        sys.exit(f"rank {args.worker}: a batch straddles the row range [{low}, {high}); pick --samples so it does not")
    folder = args.out / f"gpus{args.world}" / "hidden_states"
    folder.mkdir(parents=True, exist_ok=True)
    writer = BackgroundWriter(threads=2 if device.type == "cuda" else 1, depth=2)
    extractor = Extractor(model, layer_ids, dims["hidden_size"], device, dtype, writer, batch_tokens)
    extractor.extract(mine[0], [rows[i] for i in mine[0]], set(), folder)  # warm-up, writes nothing
    single.synchronize(device)
    ready = args.out / f"ready-{args.world}-{args.worker}"
    ready.touch()
    go = args.out / f"go-{args.world}"
    while not go.exists():
        time.sleep(0.001)
    started = time.time()
    try:
        for batch in mine:
            extractor.extract(batch, [rows[i] for i in batch], set(range(low, high)), folder)
    finally:
        writer.close()
        extractor.capture.remove()
    finished = time.time()
    print(json.dumps({"rank": args.worker, "rows": [low, high], "started": started, "finished": finished,
                      "tokens": sum(len(rows[i]) for batch in mine for i in batch)}))


def run_world(args: argparse.Namespace, world: int) -> dict:
    out = args.out
    shutil.rmtree(out / f"gpus{world}", ignore_errors=True)
    for stale in [*out.glob(f"ready-{world}-*"), out / f"go-{world}"]:
        stale.unlink(missing_ok=True)
    processes = []
    for rank in range(world):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(rank)}
        argv = [sys.executable, __file__, "--out", str(out), "--worker", str(rank), "--world", str(world),
                "--gpus", str(args.gpus)]
        argv += ["--tiny"] if args.tiny else []
        for name in ("samples", "seq_len", "batch_tokens"):
            if getattr(args, name):
                argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        processes.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
    while len(list(out.glob(f"ready-{world}-*"))) < world:
        if any(process.poll() not in (None, 0) for process in processes):
            sys.exit(f"{world} GPU(s): a worker failed while starting")
        time.sleep(0.05)
    (out / f"go-{world}").touch()
    reports = []
    for process in processes:
        stdout, _ = process.communicate()
        if process.returncode != 0:
            sys.exit(f"{world} GPU(s): a worker exited {process.returncode}")
        reports.append(json.loads(stdout.strip().splitlines()[-1]))
    seconds = max(report["finished"] for report in reports) - min(report["started"] for report in reports)
    tokens = sum(report["tokens"] for report in reports)
    return {"gpus": world, "seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "ranks": reports}


def digests(folder: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.glob("hs_*"))}


def main() -> None:
    args = parse_args()
    if args.worker is not None:
        worker(args)
        return
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    visible = torch.cuda.device_count()
    one = run_world(args, 1)
    print(f"1 GPU: {one['tokens_per_s']:,.0f} tokens/s ({one['seconds']:.2f} s)", file=sys.stderr)
    figures = {"visible_gpus": visible, "1": one}
    if visible >= args.gpus or args.tiny:
        wide = run_world(args, args.gpus)
        figures[str(args.gpus)] = wide
        reference, ours = digests(args.out / "gpus1" / "hidden_states"), digests(
            args.out / f"gpus{args.gpus}" / "hidden_states")
        differing = sorted(name for name in reference if ours.get(name) != reference[name])
        figures["files"] = {"compared": len(reference), "differing": differing,
                            "identical": not differing and set(ours) == set(reference)}
    dims, samples, seq_len, batch_tokens = settings(args)
    print(f"\nsetting: hidden {dims['hidden_size']}, {dims['num_hidden_layers']} layers, {samples} rows of "
          f"{seq_len} tokens, {batch_tokens} padded tokens per batch, {visible} GPU(s) visible")
    print(f"{'GPUs':>5} {'tokens/s':>12} {'seconds':>8} {'x 1 GPU':>8}")
    print(f"{1:>5} {one['tokens_per_s']:12,.0f} {one['seconds']:8.2f} {1.0:8.2f}")
    if "files" in figures:
        wide = figures[str(args.gpus)]
        print(f"{args.gpus:>5} {wide['tokens_per_s']:12,.0f} {wide['seconds']:8.2f} "
              f"{wide['tokens_per_s'] / one['tokens_per_s']:8.2f}")
        files = figures["files"]
        print(f"files: {files['compared']} compared, {'all identical' if files['identical'] else 'DIFFERENT: '}"
              f"{'' if files['identical'] else ', '.join(files['differing'][:10])}")
    else:
        print(f"{args.gpus:>5} not run: {visible} GPU(s) visible; the 1-GPU row is the baseline")
    (args.out / "multi.json").write_text(json.dumps(figures, indent=2) + "\n")
    for world in (1, args.gpus):
        shutil.rmtree(args.out / f"gpus{world}", ignore_errors=True)


if __name__ == "__main__":
    main()
