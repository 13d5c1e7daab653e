"""The provenance record every evaluation writes beside its figures (<run>/evaluation/record.json), and
what differs between two records: specops' own revision (the commit the agent came from, dirty or not), the
checkpoint's digest, the replay settings or the exact server command, the patch sets applied in each env the
run uses (their state on the host now, their last verify, their files' digests), the package versions, the
host's GPU or CPU kind and flags, the seeds, the prompt sets' digests, the target's and the data's digests and
the run config's digest, then the figures. A difference is told, never a failure by itself: only the figures
decide whether a record was reproduced."""

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
PARTS = ("specops", "versions", "hardware", "settings", "checkpoint", "target", "data", "prompt_sets", "patches",
         "run_config", "seeds")
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


def patch_sets(run: Run, serve_python: str | None) -> dict[str, Any] | None:
    """The patch sets applicable in each env the run uses here ("ROLE: SET"), as the host's patch records have
    them now, with the env's last verify (by a patches step) and the digests of the set's files."""
    from specops.pipeline.patches import env_states
    from specops.pipeline.run import file_digest

    sets = env_states(serve_python)
    for key, entry in sets.items():
        folder = run.paths.workdir / "patches" / key.split(": ", 1)[-1]
        files = sorted(path for path in folder.rglob("*") if path.is_file()) if folder.is_dir() else []
        entry["digest"] = {str(path.relative_to(folder)): file_digest(path) for path in files} or None
    return sets or None


def target(run: Run) -> dict[str, Any]:
    """The target by the digests the run's steps decide by (regenerate's, extract's and the servers'
    model_digest: config.json by content, weights by name and size; the tokenizer's files by content), and for a
    target written from a GGUF file that file (its path, digest, size) and the dtype it was written in."""
    from specops.pipeline.run import gguf_source, model_digest, tokenizer_digest

    source = gguf_source(run.model_path)
    if source is not None:  # where the file lies is not what it holds: its digest is compared, its path not
        source = {"file": source.get("gguf"), **{key: value for key, value in source.items() if key != "gguf"}}
    return {"model": run.config.model, "digest": model_digest(run.model_path),
            "tokenizer": tokenizer_digest(run.model_path), "gguf": source}


def data(run: Run) -> dict[str, Any]:
    """The data the draft learned from: the data file's digest as prepare recorded it (what the prepared rows
    were made of; computed now where no prepare is recorded), and the target's own answers to it where the
    run regenerates (their file's digest)."""
    from specops.pipeline.data import regenerated
    from specops.pipeline.run import Manifest, file_digest

    recorded = (Manifest(run.paths.run_dir).record("prepare") or {}).get("inputs") or {}
    digest = recorded.get("data_digest")
    if digest is None:
        path = run.paths.resolve(run.config.data)
        digest = file_digest(path) if path.is_file() else None
    answers = run.paths.regenerated / regenerated.RESPONSES_FILE
    return {"file": run.config.data, "digest": digest,
            "regenerated": file_digest(answers) if run.config.regenerate.enabled and answers.is_file() else None}


def record(run: Run, *, checkpoint: Path, checkpoint_digest: str, settings: dict[str, Any],
           prompt_sets: dict[str, Any], figures: dict[str, Any], serve_version: str | None,
           serve_python: str | None = None) -> dict[str, Any]:
    from specops.host.revision import agent_revision
    from specops.pipeline.evaluation.drafts import SEED
    from specops.pipeline.run import file_digest, package_versions

    versions = {name: package_versions().get(name) for name in ("speculators", "transformers", "torch")}
    versions["vllm"] = serve_version
    config_file = run.paths.config_file
    return {"record": VERSION, "run": run.paths.name, "specops": agent_revision(),
            "checkpoint": {"name": checkpoint.name, "path": str(checkpoint), "digest": checkpoint_digest},
            "settings": settings, "patches": patch_sets(run, serve_python), "versions": versions,
            "hardware": hardware(), "target": target(run), "data": data(run),
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
            if key.endswith((".path", ".file", ".job", "_at")) or key in ("settings.checkpoint", "specops.from"):
                # where a file lies, how the checkpoint was named, which job served, when a set was verified,
                # how the revision was learnt: not what made the figures
                continue
            if before.get(key) != after.get(key):
                lines.append(f"{key}: {before.get(key, '(absent)')} -> {after.get(key, '(absent)')}")
    return lines


def figure_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Lines for every mean acceptance length that differs (per set and draft)."""
    before, after = _flat(old.get("figures"), "figures"), _flat(new.get("figures"), "figures")
    return [f"{key}: {before.get(key)} -> {after.get(key)}" for key in sorted(set(before) | set(after))
            if before.get(key) != after.get(key)]
