"""A target from a GGUF file: the run's `model:` names a `.gguf` (a path, or `pkg:MODULE/FILE.gguf` inside an
installed package) and every step reads a normal model folder written from it once.

Many real models reach users as GGUF (llama.cpp's format; the registry's SmolLM2-135M-Instruct ships as a Q4_1
file). transformers loads one (`from_pretrained(folder, gguf_file=NAME)`, with the `gguf` package) into a
dequantized model, but refuses to `save_pretrained` it (a GGUF-quantized model is not serialisable), and vLLM and
speculators' trainer want a folder. So the folder is written here, in two parts, each whole or not at all:

- its description (config.json with its architecture named, the tokenizer, `gguf_source.json` naming the file and
  its digest): a metadata read, no weights, seconds. The doctor and the run check need it to judge the target
  (vLLM's registry, the layers, the tokenizer) before any load, so it is written when the run is opened;
- its weights (model.safetensors, in the run's dtype): a model load, written by the first step that needs the
  target (`open_run(..., weights=True)`, which every step's entry uses).

Where the folder is, and why there: pipeline.run.gguf_target.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput
from specops.host import atomic
from specops.pipeline.run import SOURCE_FILE, gguf_digest, is_gguf, written_dtype

if TYPE_CHECKING:
    from specops.pipeline.run import Run

WEIGHTS_FILE = "model.safetensors"


def described(folder: Path) -> bool:
    return (folder / SOURCE_FILE).is_file() and (folder / "config.json").is_file()


def complete(folder: Path) -> bool:
    return described(folder) and (folder / WEIGHTS_FILE).is_file()


def ensure(run: Run, weights: bool) -> dict[str, Any] | None:
    """The run's GGUF target as a folder (None when the run's model is no GGUF): its description always, its weights
    when `weights`. What is already there is kept; a failure leaves nothing half-written."""
    if not is_gguf(run.config.model):
        return None
    folder, source = run.model_path, run.gguf_path
    made = []
    if not described(folder):
        print(f"reading the GGUF target {source} (metadata and tokenizer, no weights) into {folder}", file=sys.stderr)
        atomic.replace_folder(folder, lambda staging: _describe(run, staging))
        made.append("description")
    if weights and not complete(folder):
        print(f"writing the GGUF target's weights ({written_dtype(run.config.dtype)}) into {folder}: one model load",
              file=sys.stderr)
        _write_weights(run, folder)
        made.append("weights")
    return {"gguf": str(source), "folder": str(folder), "made": made}


def _source(run: Run) -> Path:
    source = run.gguf_path
    assert source is not None  # ensure() is the only caller, for GGUF runs
    return source


def _problem(path: Path, exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, ImportError) or ("gguf" in text.lower() and "install" in text.lower()):
        return (f"reading a GGUF target needs the gguf package in this env ({sys.executable}): pip install gguf "
                f"accelerate ({text})")
    return f"{path}: not a GGUF model transformers can read: {text}"


def _describe(run: Run, staging: Path) -> None:
    """config.json (architecture named, no quantization_config), the tokenizer's files and gguf_source.json."""
    path = _source(run)
    try:
        from transformers import AutoConfig, AutoTokenizer
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        trust = run.config.trust_remote_code  # a GGUF carries no code; passed as every load of the target passes it
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=trust)
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=trust)
    except Exception as exc:
        raise BadInput(f"{run.paths.config_file}: model: {_problem(path, exc)}") from None
    architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if architecture is None:
        raise BadInput(f"{run.paths.config_file}: model: {path}: model_type {config.model_type!r} has no causal LM "
                       "class in this transformers")
    config.architectures = [architecture]
    values = config.to_diff_dict()  # as save_pretrained writes it: what differs from the class's defaults
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):  # plain weights; no loader's path
        values.pop(key, None)
    values["dtype"] = written_dtype(run.config.dtype)
    (staging / "config.json").write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(str(staging))
    record = {"gguf": str(path), "model": run.config.model, "digest": gguf_digest(path, run.paths.workdir),
              "bytes": path.stat().st_size, "dtype": written_dtype(run.config.dtype), "architecture": architecture,
              "gguf_model_type": config.model_type}
    (staging / SOURCE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def _write_weights(run: Run, folder: Path) -> None:
    """model.safetensors: the dequantized state dict in the written dtype, the tied head left out (transformers ties
    it again at load, and safetensors refuses shared tensors)."""
    import torch
    import transformers
    from safetensors.torch import save_file

    path = _source(run)
    dtype = getattr(torch, written_dtype(run.config.dtype))
    # the class the description named (transformers' causal-LM class for the GGUF's model type), as every step
    # loads a target by its architecture's own class
    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    try:
        model_class = getattr(transformers, architecture)
        model = model_class.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype,
                                            trust_remote_code=run.config.trust_remote_code)
    except Exception as exc:
        raise BadInput(f"{run.paths.config_file}: model: {_problem(path, exc)}") from None
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    tensors = {key: value.detach().to(dtype).contiguous() for key, value in state.items()}
    staging = folder / f".{WEIGHTS_FILE}.{os.getpid()}.tmp"
    try:
        save_file(tensors, str(staging), metadata={"format": "pt"})
        with staging.open("rb") as handle:
            os.fsync(handle.fileno())
        staging.rename(folder / WEIGHTS_FILE)
        atomic.fsync_dir(folder)
    finally:
        staging.unlink(missing_ok=True)
