"""Check 5: GPUs, disk for the hidden states, staging vs output filesystem, tmux, a writable workdir."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from specops.doctor._report import Item
from specops.gpus import read as read_gpus

GIB = 1024**3


def existing_ancestor(path: Path) -> Path:
    """The path itself or its nearest ancestor that exists (what a folder about to be created lives on)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def gpus() -> Item:
    reading = read_gpus()
    if not reading.found:
        return Item("resources", "warn", "nvidia-smi", "not found: no NVIDIA GPU visible to this host",
                    "run on a GPU host, or use the hf backend on CPU for tiny models")
    if reading.error is not None:
        return Item("resources", "error", "nvidia-smi", f"failed: {reading.error}", "check the NVIDIA driver")
    rows = reading.gpus
    if not rows:
        return Item("resources", "error", "nvidia-smi", "no GPU listed", "check CUDA_VISIBLE_DEVICES and the driver")
    described = "; ".join(f"GPU {r['index']} {r['name']}: {r['memory_free_mib'] / 1024:.1f} of "
                          f"{r['memory_total_mib'] / 1024:.1f} GiB free"
                          for r in rows if r["memory_free_mib"] is not None and r["memory_total_mib"] is not None)
    return Item("resources", "ok", "nvidia-smi", f"{len(rows)} GPU(s): {described}")


def storage(samples: int | None, seq_len: int | None, layers: int | None, hidden: int | None,
            output_dir: str | None) -> Item:
    if not (samples and seq_len and layers and hidden and output_dir):
        return Item("resources", "unknown", output_dir or "output_dir", "cannot project hidden-state storage: "
                    "needs samples, max_seq_len, layer ids, hidden size and output_dir",
                    "set samples and max_seq_len in the run config, and put the target (its config.json) on the host")
    needed = samples * seq_len * layers * hidden * 2  # bf16
    place = existing_ancestor(Path(output_dir))
    free = shutil.disk_usage(place).free
    why = (f"hidden states need up to {needed / GIB:.2f} GiB ({samples} samples × {seq_len} tokens × "
           f"{layers} layers × {hidden} × 2 bytes); {free / GIB:.2f} GiB free on {place}")
    if needed > free:
        return Item("resources", "error", output_dir, why, "free disk space or lower samples/max_seq_len")
    if needed > 0.8 * free:
        return Item("resources", "warn", output_dir, why, "little room left for checkpoints and logs")
    return Item("resources", "ok", output_dir, why)


def same_filesystem(staging_dir: str | None, output_dir: str | None) -> Item | None:
    if not (staging_dir and output_dir):
        return None
    staging, output = existing_ancestor(Path(staging_dir)), existing_ancestor(Path(output_dir))
    if os.stat(staging).st_dev == os.stat(output).st_dev:
        return Item("resources", "ok", f"{staging_dir} -> {output_dir}", "same filesystem: files move by rename")
    return Item("resources", "error", f"{staging_dir} -> {output_dir}", "different filesystems: hidden-state "
                "files are copied, not renamed, and a crash leaves truncated files",
                "put the vLLM staging directory on the output directory's filesystem")


def tmux() -> Item:
    found = shutil.which("tmux")
    if found:
        return Item("resources", "ok", found, "tmux present for long jobs")
    return Item("resources", "error", "tmux", "not installed: long jobs cannot run detached", "apt-get install tmux")


def writable(workdir: Path) -> Item:
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=workdir, prefix=".doctor-"):
            pass
    except OSError as exc:
        return Item("resources", "error", str(workdir), f"workdir not writable: {exc.strerror}",
                    "fix the workdir's permissions or choose another")
    return Item("resources", "ok", str(workdir), "workdir writable")
