"""The provenance record every evaluation writes beside its figures (<run>/evaluation/record.json), and
what differs between two records: the checkpoint's digest, the replay settings or the exact server
command, the patch sets applied (with their digests), the package versions, the host's GPU or CPU kind
and flags, the seeds, the prompt sets' digests and the run config's digest, then the figures."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput

if TYPE_CHECKING:
    from specops.pipeline.run import Run

RECORD_FILE = "record.json"
VERSION = 1
# the record's parts a figure depends on, in the order a difference is told
PARTS = ("versions", "hardware", "settings", "checkpoint", "prompt_sets", "patches", "run_config", "seeds")
# CPU flags that change kernels (vLLM's CPU backends and torch's choose by them)
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8", "fma")


def hardware() -> dict[str, Any]:
    """The host's GPUs (names) or its CPU's model and the flags that pick kernels."""
    from specops.host import gpus

    kind = gpus.host_kind()
    found: dict[str, Any] = {"kind": kind, "machine": platform.machine()}
    if kind == "gpu":
        reading = gpus.read()
        found["gpus"] = sorted(str(row.get("name")) for row in reading.gpus or [] if isinstance(row, dict)) or None
    model, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model is None:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    found.update(cpu=model, cpu_flags=[flag for flag in CPU_FLAGS if flag in flags])
    return found


def patch_sets(run: Run) -> list[dict[str, Any]] | None:
    """The patch sets the run's patches step applied, with the digests of their folders' files."""
    from specops.pipeline.run import Manifest, file_digest

    record = Manifest(run.paths.run_dir).record("patches") or {}
    names = ((record.get("counts") or record.get("report") or {}).get("sets")
             or (record.get("inputs") or {}).get("sets") or [])
    sets = []
    for entry in names:
        name = str(entry).split(": ", 1)[-1]
        folder = run.paths.workdir / "patches" / name
        files = sorted(path for path in folder.rglob("*") if path.is_file()) if folder.is_dir() else []
        sets.append({"name": str(entry), "digest": {str(path.relative_to(folder)): file_digest(path) for path in files}
                     or None})
    return sets or None


def record(run: Run, *, checkpoint: Path, checkpoint_digest: str, settings: dict[str, Any],
           prompt_sets: dict[str, Any], figures: dict[str, Any], serve_version: str | None) -> dict[str, Any]:
    from specops.pipeline.evaluation.drafts import SEED
    from specops.pipeline.run import file_digest, package_versions

    versions = {name: package_versions().get(name) for name in ("speculators", "transformers", "torch")}
    versions["vllm"] = serve_version
    config_file = run.paths.config_file
    return {"record": VERSION, "run": run.paths.name,
            "checkpoint": {"name": checkpoint.name, "path": str(checkpoint), "digest": checkpoint_digest},
            "settings": settings, "patches": patch_sets(run), "versions": versions, "hardware": hardware(),
            "seeds": {"untrained_draft": SEED, "decoding": "greedy (temperature 0)"},
            "prompt_sets": prompt_sets,
            "run_config": {"file": str(config_file),
                           "digest": file_digest(config_file) if config_file.is_file() else None},
            "figures": figures}


def read_record(path: Path) -> dict[str, Any]:
    """A record written by an evaluation, checked for the keys --reproduce needs (bad input otherwise)."""
    try:
        document = json.loads(path.read_text())
    except OSError as exc:
        raise BadInput(f"--reproduce: cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise BadInput(f"--reproduce: {path}: not JSON ({exc.msg})") from None
    if not isinstance(document, dict):
        raise BadInput(f"--reproduce: {path}: expected a JSON object")
    for key in ("checkpoint", "settings", "figures", "versions", "prompt_sets"):
        if not isinstance(document.get(key), dict):
            raise BadInput(f"--reproduce: {path}: key {key!r}: missing or not an object")
    if not isinstance(document["checkpoint"].get("digest"), str):
        raise BadInput(f"--reproduce: {path}: key 'checkpoint.digest': missing")
    return document


def _flat(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        found: dict[str, Any] = {}
        for key, item in value.items():
            found.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
        return found
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        found = {}  # the servers, the patch sets: item by item, so one line names what changed in which
        for index, item in enumerate(value):
            found.update(_flat(item, f"{prefix}[{index}]"))
        return found
    return {prefix: value}


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One line per value that differs between two records' parts (figures apart), e.g.
    'versions.transformers: 5.18.0 -> 5.19.0'."""
    lines = []
    for part in PARTS:
        before, after = _flat(old.get(part), part), _flat(new.get(part), part)
        for key in sorted(set(before) | set(after)):
            if key.endswith((".path", ".file", ".job")) or key == "settings.checkpoint":
                continue  # where a file lies, how the checkpoint was named, which job served: not what it holds
            if before.get(key) != after.get(key):
                lines.append(f"{key}: {before.get(key, '(absent)')} -> {after.get(key, '(absent)')}")
    return lines


def figure_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Lines for every mean acceptance length that differs (per set and draft)."""
    before, after = _flat(old.get("figures"), "figures"), _flat(new.get("figures"), "figures")
    return [f"{key}: {before.get(key)} -> {after.get(key)}" for key in sorted(set(before) | set(after))
            if before.get(key) != after.get(key)]
