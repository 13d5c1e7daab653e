"""What the doctor's run checks read about a run: a plain value, so the doctor never imports the pipeline.

specops.pipeline.preflight builds it from a loaded run; `--run-json` gives it as a JSON object
(for runs that live elsewhere, and for tests), checked here key by key.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from specops.contract.errors import BadInput
from specops.contract.values import json_object

BACKENDS = ("vllm", "hf")
SERVES_DRAFT = ("asked", "default")


@dataclass(frozen=True)
class RunSettings:
    model_path: str | None = None        # the target's folder on this host (config.json, tokenizer files)
    trust_remote_code: bool = False
    layer_ids: list[int] | None = None   # None: the defaults for the target's layer count
    draft_vocab_size: int | None = None
    samples: int | None = None           # with max_seq_len and layer_ids: the hidden states' disk size
    max_seq_len: int | None = None
    backend: str | None = "vllm"         # "vllm" or "hf" (needs no vLLM); None: no run, vLLM optional
    output_dir: str | None = None        # where the hidden states go
    staging_dir: str | None = None       # where vLLM writes them first (same filesystem, or they are copied)
    serve_flags: list[str] = field(default_factory=list)     # the option names each launched command passes
    serve_args: list[str] = field(default_factory=list)      # the run's own vllm.serve_args, values and all
    prepare_flags: list[str] = field(default_factory=list)
    generate_flags: list[str] = field(default_factory=list)
    train_flags: list[str] = field(default_factory=list)
    gpus: int | None = None              # the host's GPUs (what the parallel sizes must fit)
    compute_capability: int | None = None  # the GPUs' compute capability as vLLM counts it (90: Hopper); None: read
    tensor_parallel: int | None = None   # vLLM's sizes the run will serve with (None: not a vLLM run)
    data_parallel: int | None = None
    expert_parallel: bool = False        # --enable-expert-parallel among the serve args
    dtype: str = "auto"                  # the run's dtype setting: with the GPUs, the hidden states' dtype
    tokens: int | None = None            # the rows' tokens (counted or estimated); None: samples x max_seq_len
    tokens_source: str | None = None
    hidden_states_mode: str = "offline"  # offline | online | hybrid: how much of them lands on disk
    hidden_states_backend: str = "file"  # file | fp8 | mooncake: the connector the server loads (_connector.py)
    disk_budget_gb: float | None = None
    serve_python: str | None = None      # the serve env's interpreter (inventory envs.serve): vLLM is read there
    # whether vLLM serves the trained draft on this host: "asked" (evaluate.backend: vllm, parity.serve: true,
    # --backend vllm on evaluate), "default" (the run's backend; the hf replay stands in where vLLM cannot),
    # None (nothing serves it here)
    serves_draft: str | None = None
    # the run's settings known to waste a training (planning.learning_advice), one line each: warnings
    advice: list[str] = field(default_factory=list)
    draft_method: str | None = None      # the run's draft.method (speculators' --speculator-type); None: eagle3


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


# key -> (is it valid, what was expected); keys not listed are the run config's, not the doctor's
_RULES: dict[str, tuple[Any, str]] = {
    "model_path": (lambda v: isinstance(v, str), "a string"),
    "output_dir": (lambda v: isinstance(v, str), "a string"),
    "staging_dir": (lambda v: isinstance(v, str), "a string"),
    "trust_remote_code": (lambda v: isinstance(v, bool), "true or false"),
    "layer_ids": (lambda v: isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v),
                  "a list of integers or null"),
    "draft_vocab_size": (_positive, "a positive integer"),
    "samples": (_positive, "a positive integer"),
    "max_seq_len": (_positive, "a positive integer"),
    "backend": (lambda v: v in BACKENDS, "'vllm' or 'hf'"),
    "gpus": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a whole number >= 0"),
    "compute_capability": (_positive, "a compute capability as a whole number, e.g. 90 for 9.0"),
    "tensor_parallel": (_positive, "a positive integer"),
    "data_parallel": (_positive, "a positive integer"),
    "expert_parallel": (lambda v: isinstance(v, bool), "true or false"),
    "dtype": (lambda v: v in ("auto", "bfloat16", "float32"), "'auto', 'bfloat16' or 'float32'"),
    "tokens": (_positive, "a positive integer"),
    "tokens_source": (lambda v: isinstance(v, str), "a string"),
    "hidden_states_mode": (lambda v: v in ("offline", "online", "hybrid"), "'offline', 'online' or 'hybrid'"),
    "hidden_states_backend": (lambda v: v in ("file", "fp8", "mooncake"), "'file', 'fp8' or 'mooncake'"),
    "disk_budget_gb": (lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v > 0, "a number > 0"),
    "serve_python": (lambda v: isinstance(v, str), "a string"),
    "serves_draft": (lambda v: v in SERVES_DRAFT, "'asked' or 'default'"),
    "draft_method": (lambda v: isinstance(v, str) and v.isidentifier(), "a kind of draft, e.g. 'eagle3' or 'dflash'"),
    **{key: (_strings, "a list of strings") for key in ("serve_flags", "serve_args", "prepare_flags",
                                                         "generate_flags", "train_flags", "advice")},
}
assert set(_RULES) == {f.name for f in fields(RunSettings)}


def parse_run_json(text: str, source: str = "--run-json") -> RunSettings:
    """RunSettings from a JSON object; BadInput names the key and what is wrong."""
    raw = json_object(source, text) or {}
    values = {}
    for key, value in raw.items():
        if key not in _RULES or value is None:
            continue
        valid, expected = _RULES[key]
        if not valid(value):
            raise BadInput(f"{source}: key {key}: expected {expected}, got {value!r}")
        values[key] = value
    return RunSettings(**values)
