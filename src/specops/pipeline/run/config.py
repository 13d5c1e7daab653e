"""Run configs: `runs/<name>.yaml` validated into a RunConfig, plus the values derived from it.

A run config names the target model, the conversations to learn from, the layers whose hidden
states feed the draft, and the draft and training settings. Unknown keys and bad values are bad
input: one line naming the file, the key and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specops.errors import BadInput
from specops.parallel import ModelShape, ParallelSizes, resolve_sizes
from specops.paths import workdir
from specops.protocol import name_problem


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class DraftSettings(_Strict):
    vocab_size: int = Field(32000, gt=0)
    num_layers: int = Field(1, gt=0)
    ttt_steps: int = Field(3, gt=0)


class StopIf(_Strict):
    """End a draft that learns nothing: after epoch `epoch` (speculators' number, 0 = the first), a mean
    acceptance length below `acceptance_length_below` on the per-epoch held-out prompts stops the trainer."""
    epoch: int = Field(ge=0)
    acceptance_length_below: float = Field(gt=1)  # 1.0 is nothing accepted: a bound at or below it never fires


class TrainSettings(_Strict):
    epochs: int = Field(10, gt=0)
    lr: float = Field(1e-4, gt=0)
    loss_implementation: Literal["auto", "eager", "fused"] = "auto"
    draft_attn_impl: str | None = None
    # Tokens packed into one training batch (speculators' --total-seq-len; its default is 8192).
    total_seq_len: int | None = Field(None, gt=0)
    # Unset: speculators' own defaults (0.9.0: Muon, a log line and a GPU sync every step, 12 workers).
    optimizer: Literal["adamw", "muon"] | None = None
    log_freq: int | None = Field(None, gt=0)  # log (and time) every N steps
    loader_workers: int | None = Field(None, ge=0)  # dataloader worker processes (--num-workers)
    extra_args: list[str] = Field(default_factory=list)
    stop_if: StopIf | None = None

    @field_validator("stop_if")
    @classmethod
    def _stop_within_epochs(cls, value: StopIf | None, info: Any) -> StopIf | None:
        epochs = info.data.get("epochs")
        if value is not None and epochs is not None and value.epoch >= epochs:
            raise ValueError(f"epoch {value.epoch} is not below train.epochs ({epochs}): the check would never "
                             "run (epochs count from 0)")
        return value


class VllmSettings(_Strict):
    serve_args: list[str] = Field(default_factory=list)
    port: int = Field(8000, gt=0, lt=65536)
    # the run's server outlives its pipeline only when asked (a next run on the same target reuses it);
    # else it is stopped with the run's last step: it holds the GPUs' memory and the port. true: until
    # stopped by hand; an idle timeout (seconds, or "30m", "2h", "90s"): it stops itself once unused that long
    keep_server: bool | int = False
    # vLLM's own parallelism (--tensor-parallel-size / --data-parallel-size); left out, they are derived
    # from the host's GPUs and the model's size (specops.parallel.default_sizes)
    tensor_parallel: int | None = Field(None, gt=0)
    data_parallel: int | None = Field(None, gt=0)

    @field_validator("keep_server", mode="before")
    @classmethod
    def _keep_for(cls, value: Any) -> bool | int:
        return keep_seconds(value)


_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def keep_seconds(value: Any) -> bool | int:
    """vllm.keep_server as the run means it: False, True (until stopped by hand) or an idle timeout in seconds."""
    import re

    if isinstance(value, bool):
        return value
    seconds: float | None = None
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (found := re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", value.lower())):
        seconds = float(found.group(1)) * _UNITS[found.group(2)]
    if seconds is None:
        raise ValueError(f"{value!r} is not true, false or an idle timeout (seconds, or e.g. 90s, 30m, 2h)")
    if seconds < 1:
        raise ValueError(f"an idle timeout of {value!r} is under a second (false: stopped with the run's last step)")
    return round(seconds)


class RegenerateSettings(_Strict):
    """The target answers the conversations' prompts itself (step `regenerate`, before prepare)."""
    enabled: bool = False
    backend: Literal["vllm", "hf"] | None = None  # None: the run's backend
    max_tokens: int = Field(128, gt=0)  # tokens per generated answer
    temperature: float = Field(0.0, ge=0)  # 0: greedy
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int = 0  # sampling seed (temperature > 0)
    concurrency: int = Field(32, gt=0)  # vllm: requests in flight; hf: conversations per batch


class EvaluateSettings(_Strict):
    """Acceptance of the draft served as the target's EAGLE-3 speculator (step `evaluate`, after train)."""
    enabled: bool = False
    heldout_prompts: int = Field(0, ge=0)  # set aside by prepare, never trained on; evaluation's prompts
    backend: Literal["vllm", "hf"] | None = None  # None: the run's backend
    num_speculative_tokens: int = Field(3, gt=0)
    max_tokens: int = Field(64, gt=0)
    checkpoint: str = "best"  # best (by the acceptance recorded every epoch) | last | an epoch number
    # After every epoch, the acceptance on the first N held-out prompts (the replay); 0 turns it off
    epoch_prompts: int = Field(8, ge=0)
    # vllm: the untrained draft's floor by the replay (no server load of its own) or by a server of its own
    untrained: Literal["replay", "server"] = "replay"
    # vllm: the speedup's baseline (the target alone) is measured on the extraction server during extract
    # (its captures may make it read slow); true: on a server of its own (a load), the honest figure;
    # false and no extraction-server rate: the report says the speedup was not measured
    baseline_server: bool = False


class HiddenStatesSettings(_Strict):
    """Where the trainer's hidden states come from: offline (all extracted to disk first), online (the
    run's vLLM server makes them as the trainer asks) or hybrid (up to the disk budget on disk, the rest
    online). `invoke plan` shows what each costs; a mode that does not fit is refused before launch.

    offline  extract writes every row's file, then training reads them (`--on-missing raise`);
    online   the run's vllm-server job stays up through training and speculators asks it for every
             row (`--on-missing generate`); generated states are discarded once loaded; no extract;
    hybrid   extract writes the first rows that fit `disk_budget_gb`, the trainer generates the rest.
    """
    mode: Literal["offline", "online", "hybrid"] = "offline"
    # decimal GB of hidden-state files on disk at any time: the run's files and the server's staged
    # ones; watched while training, not only planned before
    disk_budget_gb: float | None = Field(None, gt=0)
    # GPUs of one host: split (server on some, trainer on the rest) or shared (the server's memory
    # share lowered); null: the plan chooses
    placement: Literal["split", "shared"] | None = None
    server_gpus: int | None = Field(None, gt=0)  # split: the server's GPUs (default: the plan's)
    server_memory_share: float | None = Field(None, gt=0, lt=1)  # shared: vLLM --gpu-memory-utilization
    # speculators' bounds on one generation request (--request-timeout, --max-retries) and its circuit
    # breaker (--max-consecutive-generation-failures); our own watch of the server job comes first
    request_timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(1, ge=0)
    max_consecutive_failures: int = Field(3, gt=0)
    # vllm: extraction requests in flight (speculators' --concurrency). The server batches what is in flight
    # as it arrives, and a prompt's states can differ in their last bits with the batch it was in; 1: each
    # prompt alone, its file's bytes a function of the prompt only (slower on a GPU)
    concurrency: int = Field(8, gt=0)

    @property
    def extracts(self) -> bool:
        """The step table's enable rule of extract and validate: every mode writes files but online."""
        return self.mode != "online"

    @model_validator(mode="after")
    def _budget_for_hybrid(self) -> HiddenStatesSettings:
        if self.mode == "hybrid" and self.disk_budget_gb is None:
            raise ValueError("mode hybrid needs disk_budget_gb (extraction writes up to it)")
        if self.server_gpus is not None and self.placement == "shared":
            raise ValueError("server_gpus is for placement split, not shared")
        return self


class ParitySettings(_Strict):
    """The parity gate (pipeline/parity) before training: its config checks always run; the served
    request (one completion through a vLLM server with the untrained draft) costs a server load."""
    serve: bool | None = None  # None: where it is cheap (a GPU host or a vllm run, with a serve env)


class PlanSettings(_Strict):
    """What the plan reads on the host, given instead (a host not at hand), and rates measured elsewhere
    (left out: this run's earlier jobs on the host, else unknown)."""
    gpus: int | None = Field(None, ge=0)
    gpu_memory_gib: float | None = Field(None, gt=0)
    disk_free_gb: float | None = Field(None, ge=0)
    extract_tokens_per_s: float | None = Field(None, gt=0)  # hidden states written per second
    train_tokens_per_s: float | None = Field(None, gt=0)
    serve_tokens_per_s: float | None = Field(None, gt=0)  # hidden states the server hands the trainer online
    load_seconds: float | None = Field(None, gt=0)  # one vLLM load of the target (Kimi-K2.5 on 8 H200: ~1080)
    load_gb_per_s: float | None = Field(None, gt=0)  # or the host's read rate of its weights


class RunConfig(_Strict):
    model: str = Field(min_length=1)
    trust_remote_code: bool = False
    # generated targets (data/tiny.py, data/tiny_kimi.py)
    embedded: Literal["tiny", "1b", "8b", "kimi", "kimi-text", "kimi-gpu"] | None = None
    data: str = Field(min_length=1)
    max_seq_len: int = Field(2048, gt=0)
    samples: int | None = Field(None, gt=0)
    layer_ids: list[int] | None = None
    backend: Literal["vllm", "hf"] | None = None  # None: hf on a host without GPUs, vllm otherwise
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    draft: DraftSettings = Field(default_factory=DraftSettings)
    train: TrainSettings = Field(default_factory=TrainSettings)
    vllm: VllmSettings = Field(default_factory=VllmSettings)
    regenerate: RegenerateSettings = Field(default_factory=RegenerateSettings)
    evaluate: EvaluateSettings = Field(default_factory=EvaluateSettings)
    hidden_states: HiddenStatesSettings = Field(default_factory=HiddenStatesSettings)
    parity: ParitySettings = Field(default_factory=ParitySettings)
    plan: PlanSettings = Field(default_factory=PlanSettings)
    # inventory hosts the run spreads over (`invoke pipeline` across them); read by the control side,
    # only carried here
    hosts: list[str] | None = None

    @model_validator(mode="after")
    def _stop_if_is_measured(self) -> RunConfig:
        if self.train.stop_if is not None and not (self.evaluate.heldout_prompts and self.evaluate.epoch_prompts):
            raise ValueError("train.stop_if: needs acceptance every epoch: set evaluate.heldout_prompts and "
                             "evaluate.epoch_prompts above 0")
        return self

    @field_validator("hosts")
    @classmethod
    def _safe_host_names(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            problem = name_problem(name)
            if problem:
                raise ValueError(problem)
        return value

    @field_validator("layer_ids")
    @classmethod
    def _distinct_non_negative(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        if len(value) < 2:
            raise ValueError("needs at least one auxiliary layer and the final layer")
        if min(value) < 0:
            raise ValueError("must be >= 0")
        if len(set(value)) != len(value):
            raise ValueError("must be distinct")
        return value


def _describe(error: dict[str, Any]) -> str:
    key = ".".join(str(part) for part in error["loc"]) or "(top level)"
    kind = error["type"]
    if not error["loc"] and kind == "value_error":  # a rule across sections: its message names the keys
        return error["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        return f"{key}: unknown key"
    if kind == "missing":
        return f"{key}: required key is missing"
    message = error["msg"]
    for prefix in ("Value error, ", "Input should be "):
        if message.startswith(prefix):
            message = ("must be " if prefix == "Input should be " else "") + message[len(prefix):]
    message = message.replace("greater than", ">").replace("less than", "<").replace(" or equal to", "=")
    message = message.replace("> =", ">=").replace("< =", "<=")
    return f"{key}: {message}"


def load_run_config(path: str | Path) -> RunConfig:
    """Read and validate a run config; any problem is one BadInput line naming file and key."""
    path = Path(path)
    label = _label(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{label}: no such run config") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise BadInput(f"{label}: not valid YAML{where}") from None
    if not isinstance(raw, dict):
        raise BadInput(f"{label}: must be a mapping of keys to values")
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as exc:
        raise BadInput(f"{label}: {_describe(exc.errors()[0])}") from None


def _label(path: Path) -> str:
    try:
        return path.resolve().relative_to(workdir()).as_posix()
    except ValueError:
        return str(path)


def config_hash(section: Any) -> str:
    """A stable short hash of a config section (model, dict, list or scalar)."""
    if isinstance(section, BaseModel):
        section = section.model_dump(mode="json")
    canonical = json.dumps(section, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def text_config(model_config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: multimodal wrappers keep it under `text_config`."""
    inner = model_config.get("text_config")
    return inner if isinstance(inner, dict) else model_config


def derive_layer_ids(num_layers: int) -> list[int]:
    """Layer ids as vLLM serving uses them: auxiliary [2, n//2, n-3] plus the final id n.

    Tiny targets make that list collide ([2, 2, 1] for n=4); there the auxiliary layers are
    spread as [1, n//2, n-1] instead, the choice that trains on CPU with speculators.
    """
    if num_layers < 3:
        raise ValueError(f"a target with {num_layers} layers is too shallow for three auxiliary layers")
    auxiliary = [2, num_layers // 2, num_layers - 3]
    if len(set(auxiliary)) != 3 or min(auxiliary) < 0:
        auxiliary = [1, num_layers // 2, num_layers - 1]
    if len(set(auxiliary)) != 3:
        auxiliary = [0, 1, 2]
    return [*auxiliary, num_layers]


def read_model_config(model_path: Path) -> dict[str, Any]:
    config_file = model_path / "config.json"
    try:
        return json.loads(config_file.read_text())
    except FileNotFoundError:
        raise BadInput(f"{config_file}: target model config not found") from None
    except json.JSONDecodeError as exc:
        raise BadInput(f"{config_file}: not valid JSON (line {exc.lineno})") from None


class RunPaths:
    """Where a run keeps its things: <workdir>/runs/<name>/..."""

    def __init__(self, name: str, root: Path | None = None) -> None:
        self.name = name
        self.workdir = Path(root) if root else workdir()  # a caller may hand a str
        self.config_file = self.workdir / "runs" / f"{name}.yaml"
        self.run_dir = self.workdir / "runs" / name
        self.prepared = self.run_dir / "prepared"
        self.token_freq = self.prepared / "token_freq.pt"  # where `speculators train` looks for it
        self.hidden_states = self.run_dir / "hidden_states"
        self.progress = self.hidden_states / "progress.json"
        self.vocab = self.run_dir / "vocab"
        self.checkpoints = self.run_dir / "checkpoints"
        self.manifest = self.run_dir / "manifest.json"
        self.prepare_report = self.run_dir / "prepare_report.json"
        self.validate_report = self.run_dir / "validate_report.json"
        self.regenerated = self.run_dir / "regenerated"
        self.heldout = self.run_dir / "heldout"
        self.evaluation = self.run_dir / "evaluation"

    def resolve(self, value: str) -> Path:
        """A path from the run config: relative paths are relative to the workdir."""
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.workdir / path

    def as_dict(self) -> dict[str, str]:
        keys = ["config_file", "run_dir", "prepared", "token_freq", "hidden_states", "progress", "vocab",
                "checkpoints", "manifest",
                "regenerated", "heldout", "evaluation"]
        return {key: str(getattr(self, key)) for key in keys}


def check_run_name(name: str) -> str:
    """A run's name becomes runs/<name>.yaml and runs/<name>/: the one safe pattern (protocol)."""
    problem = name_problem(name)
    if problem is not None:
        raise BadInput(f"--run: {problem}")
    return name


class Run:
    """A loaded run: its config, its paths and the values derived from the target's config."""

    def __init__(self, name: str, root: Path | None = None) -> None:
        self.paths = RunPaths(check_run_name(name), root)
        self.config = load_run_config(self.paths.config_file)
        self.label = f"runs/{name}.yaml"

    def samples_for(self, asked: int | None) -> int | None:
        """The rows a step works on: --samples when given, else the run's `samples` (None: every row).
        The one place this default is applied."""
        return asked if asked is not None else self.config.samples

    @property
    def model_path(self) -> Path:
        return self.paths.resolve(self.config.model)

    def num_layers(self) -> int:
        config = text_config(read_model_config(self.model_path))
        layers = config.get("num_hidden_layers")
        if not isinstance(layers, int) or layers <= 0:
            raise BadInput(f"{self.model_path / 'config.json'}: num_hidden_layers: missing or not a count")
        return layers

    def layer_ids(self) -> list[int]:
        layers = self.num_layers()
        ids = self.config.layer_ids
        if ids is None:
            try:
                return derive_layer_ids(layers)
            except ValueError as exc:
                raise BadInput(f"{self.label}: layer_ids: {exc}; set them explicitly") from None
        if max(ids) > layers:
            raise BadInput(f"{self.label}: layer_ids: {max(ids)} is beyond the target's {layers} layers")
        if ids[-1] != layers:
            raise BadInput(f"{self.label}: layer_ids: the last id must be the final layer {layers}")
        return ids

    def parallel_sizes(self, host_gpus: int, gpu_memory_bytes: int | None = None) -> ParallelSizes:
        """vLLM's tensor x data parallel sizes for this run on a host with `host_gpus` GPUs."""
        shape = ModelShape()
        if (self.model_path / "config.json").exists():
            shape = ModelShape.from_config(read_model_config(self.model_path), self.model_path)
        return resolve_sizes(self.config.vllm.tensor_parallel, self.config.vllm.data_parallel, host_gpus, shape,
                             gpu_memory_bytes)

    def backend(self, gpu_count: int) -> str:
        """The run's backend before any command line (default_backend: the one rule); a step reads the run's
        effective settings (settings.resolve), which add --backend and the host."""
        return default_backend(self, gpu_count)[0]

    def describe(self, gpu_count: int) -> dict[str, Any]:
        return {
            "run": self.paths.name,
            "config": self.config.model_dump(mode="json"),
            "derived": {
                "model_path": str(self.model_path),
                "data_path": str(self.paths.resolve(self.config.data)),
                "num_layers": self.num_layers() if (self.model_path / "config.json").exists() else None,
                "layer_ids": self.layer_ids() if (self.model_path / "config.json").exists() else None,
                "backend": self.backend(gpu_count),
                "config_hash": config_hash(self.config),
                "paths": self.paths.as_dict(),
            },
        }


def default_backend(run: Run, gpus: int) -> tuple[str, str]:
    """(the run's backend before any flag, where it came from): `backend:`, else hf on a host without GPUs,
    vllm otherwise. settings.resolve adds the command line's --backend."""
    if run.config.backend is not None:
        return run.config.backend, f"{run.label}: backend"
    return ("hf", "default: no GPU on this host") if gpus == 0 else ("vllm", f"default: {gpus} GPU(s) on this host")
