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
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from specops.contract.errors import BadInput
from specops.contract.protocol import name_problem
from specops.host.paths import workdir
from specops.pipeline.run.known import known_runs
from specops.pipeline.run.sections import (
    DraftSettings,
    EvaluateSettings,
    HiddenStatesSettings,
    HostRoles,
    ParitySettings,
    PlanSettings,
    RegenerateSettings,
    TrainSettings,
    VllmSettings,
    _Strict,
)
from specops.planning import ModelShape, ParallelSizes, resolve_sizes


def roles_problem(hidden_states: HiddenStatesSettings) -> str | None:
    """Why these hidden-state settings cannot carry a role split (serve hosts, a train host), or None: one
    rule for the run config's `hosts: {serve, train}` and for --hosts "serve=..;train=.." given with it."""
    if hidden_states.mode != "online":
        return (f"serve and train roles take hidden_states.mode online (the trainer asks the serve hosts' "
                f"servers), not {hidden_states.mode}; offline across hosts is a plain list of hosts (hosts: [a, b], "
                "--hosts a,b)")
    if hidden_states.shared_dir is None:
        return ("serve and train roles need hidden_states.shared_dir, a folder every host sees at the same "
                "path: the servers write the states there, the trainer reads them")
    return None


class RunConfig(_Strict):
    model: str = Field(min_length=1)
    trust_remote_code: bool = False
    # generated targets (data/tiny.py, data/tiny_kimi.py)
    embedded: Literal["tiny", "1b", "8b", "kimi", "kimi-text", "kimi-gpu", "kimi-int4"] | None = None
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
    # inventory hosts the run spreads over (`invoke pipeline` across them), or by role ({serve: [...],
    # train: [...]}); read by the control side, only carried here
    hosts: list[str] | HostRoles | None = None

    @model_validator(mode="after")
    def _stop_if_is_measured(self) -> RunConfig:
        if self.train.stop_if is not None and not (self.evaluate.heldout_prompts and self.evaluate.epoch_prompts):
            raise ValueError("train.stop_if: needs acceptance every epoch: set evaluate.heldout_prompts and "
                             "evaluate.epoch_prompts above 0")
        return self

    @model_validator(mode="after")
    def _roles_train_online(self) -> RunConfig:
        if isinstance(self.hosts, HostRoles) and (problem := roles_problem(self.hidden_states)):
            raise ValueError(f"hosts: {problem}")
        return self

    @field_validator("hosts")
    @classmethod
    def _safe_host_names(cls, value: list[str] | HostRoles | None) -> list[str] | HostRoles | None:
        names = [*value.serve, *value.train] if isinstance(value, HostRoles) else value or []
        for name in names:
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
        raise BadInput(f"{label}: no such run config{known_runs(path)}") from None
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


SWEEPS = "sweeps"  # <run>/sweeps/<setting>/: a training sweep's settings (pipeline.run.sweeps)


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

    def for_setting(self, folder: str, *, own_vocab: bool) -> RunPaths:
        """A training sweep's setting (pipeline.run.sweeps): its own checkpoints, evaluation, parity report and
        manifest under <run>/sweeps/<folder>/ (its run folder, as the manifest and the steps read it), and its
        own vocabulary when `own_vocab`; the run's prepared rows, hidden states, held-out prompts and answers."""
        import copy

        paths = copy.copy(self)
        paths.run_dir = self.run_dir / SWEEPS / folder
        paths.checkpoints = paths.run_dir / "checkpoints"
        paths.evaluation = paths.run_dir / "evaluation"
        paths.manifest = paths.run_dir / "manifest.json"
        if own_vocab:
            paths.vocab = paths.run_dir / "vocab"
        return paths

    def resolve(self, value: str) -> Path:
        """A path from the run config: relative paths are relative to the workdir; `pkg:MODULE/PATH` is a file
        inside a package installed in this env (host.packaged)."""
        from specops.host.packaged import is_packaged, resolve_packaged

        if is_packaged(value):
            try:
                return resolve_packaged(value)
            except BadInput as exc:
                raise BadInput(f"{self.config_file}: {exc}") from None
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
        self._gguf_folder: Path | None = None

    def samples_for(self, asked: int | None) -> int | None:
        """The rows a step works on: --samples when given, else the run's `samples` (None: every row).
        The one place this default is applied."""
        return asked if asked is not None else self.config.samples

    @property
    def model_path(self) -> Path:
        """The target's folder: the run's `model:`, or for a GGUF file the folder written from it (run.gguf_target)."""
        from specops.pipeline.run.gguf_target import gguf_file, gguf_folder, is_gguf

        if not is_gguf(self.config.model):
            return self.paths.resolve(self.config.model)
        if self._gguf_folder is None:  # the file's digest once per loaded run
            source = gguf_file(self.config.model, self.paths.resolve(self.config.model), self.paths.config_file)
            self._gguf_folder = gguf_folder(source, self.paths.workdir, self.config.dtype)
        return self._gguf_folder

    @property
    def gguf_path(self) -> Path | None:
        """The GGUF file the target is written from, or None."""
        from specops.pipeline.run.gguf_target import gguf_file, is_gguf

        if not is_gguf(self.config.model):
            return None
        return gguf_file(self.config.model, self.paths.resolve(self.config.model), self.paths.config_file)

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

    def describe(self, gpu_count: int) -> dict[str, Any]:
        return {
            "run": self.paths.name,
            "config": self.config.model_dump(mode="json"),
            "derived": {
                "model_path": str(self.model_path),
                "data_path": str(self.paths.resolve(self.config.data)),
                "num_layers": self.num_layers() if (self.model_path / "config.json").exists() else None,
                "layer_ids": self.layer_ids() if (self.model_path / "config.json").exists() else None,
                "backend": default_backend(self, gpu_count)[0],  # before any command line (`run show`)
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
