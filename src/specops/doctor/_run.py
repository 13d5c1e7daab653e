"""The run's settings as the doctor reads them (a plain dict; specops.pipeline.config owns the schema)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from specops.errors import BadInput


@dataclass(frozen=True)
class RunSettings:
    model_path: str | None = None
    trust_remote_code: bool = False
    layer_ids: list[int] | None = None
    draft_vocab_size: int | None = None
    samples: int | None = None
    max_seq_len: int | None = None
    backend: str = "vllm"
    output_dir: str | None = None
    staging_dir: str | None = None
    serve_flags: list[str] = field(default_factory=list)
    prepare_flags: list[str] = field(default_factory=list)
    generate_flags: list[str] = field(default_factory=list)
    train_flags: list[str] = field(default_factory=list)


_INTS = ("draft_vocab_size", "samples", "max_seq_len")
_STRINGS = ("model_path", "output_dir", "staging_dir")
_FLAG_LISTS = ("serve_flags", "prepare_flags", "generate_flags", "train_flags")


def parse_run(text: str | None, source: str = "--run-json") -> RunSettings:
    """RunSettings from JSON text; BadInput names the key and what is wrong."""
    if not text:
        return RunSettings()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{source}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(raw, dict):
        raise BadInput(f"{source}: expected a JSON object, got {type(raw).__name__}")
    values: dict = {}
    for key, value in raw.items():
        if key not in RunSettings.__dataclass_fields__:
            continue  # the run config has more than the doctor needs
        if value is None:
            continue
        if key in _INTS and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise BadInput(f"{source}: key {key}: expected a positive integer, got {value!r}")
        if key in _STRINGS and not isinstance(value, str):
            raise BadInput(f"{source}: key {key}: expected a string, got {value!r}")
        if key == "trust_remote_code" and not isinstance(value, bool):
            raise BadInput(f"{source}: key trust_remote_code: expected true or false, got {value!r}")
        if key == "backend" and value not in ("vllm", "hf"):
            raise BadInput(f"{source}: key backend: expected 'vllm' or 'hf', got {value!r}")
        if key == "layer_ids" and (not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value)):
            raise BadInput(f"{source}: key layer_ids: expected a list of integers or null, got {value!r}")
        if key in _FLAG_LISTS and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
            raise BadInput(f"{source}: key {key}: expected a list of strings, got {value!r}")
        values[key] = value
    return RunSettings(**values)
