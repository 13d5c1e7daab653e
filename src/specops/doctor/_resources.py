"""Check 5: GPUs, disk for the hidden states, staging vs output filesystem, tmux, a writable workdir."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from specops import planning
from specops.doctor._report import Item
from specops.doctor.settings import RunSettings
from specops.host.gpus import read as read_gpus

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


def storage(settings: RunSettings, layers: int | None, hidden: int | None, on_gpu: bool) -> Item:
    """Disk for the hidden states, by the plan's arithmetic (specops.planning): the dtype the target
    computes in on this host, the rows' tokens (counted, estimated, or at most samples x max_seq_len),
    token ids and headers, and only what the run's hidden-state mode keeps on disk."""
    samples, seq_len, output_dir = settings.samples, settings.max_seq_len, settings.output_dir
    if not (samples and seq_len and layers and hidden and output_dir):
        return Item("resources", "unknown", output_dir or "output_dir", "cannot project hidden-state storage: "
                    "needs samples, max_seq_len, layer ids, hidden size and output_dir",
                    "set samples and max_seq_len in the run config, and put the target (its config.json) on the host")
    dtype = planning.hidden_state_dtype(settings.dtype, on_gpu)
    tokens = settings.tokens or samples * seq_len
    source = settings.tokens_source if settings.tokens else f"upper bound: {samples} rows x max_seq_len {seq_len}"
    offline = planning.hidden_state_file_bytes(tokens, samples, layers, hidden, dtype)
    in_flight = min(planning.ONLINE_SAMPLES_IN_FLIGHT, samples) * planning.hidden_state_file_bytes(
        seq_len, 1, layers, hidden, dtype)
    budget = int(settings.disk_budget_gb * planning.GB) if settings.disk_budget_gb else None
    needed = planning.on_disk(settings.hidden_states_mode, offline, budget, in_flight)
    place = existing_ancestor(Path(output_dir))
    free = shutil.disk_usage(place).free
    per_token = planning.hidden_state_bytes_per_token(layers, hidden, dtype)
    why = (f"{settings.hidden_states_mode} hidden states need up to {planning.human(needed)} ({tokens} tokens, "
           f"{source}; {layers} layers x {hidden} x {planning.DTYPE_BYTES[dtype]} bytes ({dtype}) = {per_token} "
           f"bytes a token + token ids and headers); {planning.human(free)} free on {place}")
    if needed > free:
        return Item("resources", "error", output_dir, why,
                    "free disk space, lower samples/max_seq_len, or set hidden_states.mode: hybrid or online")
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
