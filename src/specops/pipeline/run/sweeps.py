"""A training sweep's settings (`train --sweep KEY=V1,V2 ...`): run configs with draft.* or train.* keys changed,
read against the run's own config, and the folders each one trains and is scored in.

Every setting trains from the run's own prepared rows, hidden states and held-out prompts (and, for the run's own
draft.vocab_size, its draft vocabulary): a key whose change would make an earlier step again (regenerate, prepare,
extract) is refused, naming that step, before anything trains. A setting's own things live under
<run>/sweeps/<folder>/: its checkpoints, evaluation, parity report, its vocabulary when its draft.vocab_size is not
the run's, and its manifest, which holds the run's records of the steps training reads (copied from the run's at
every sweep) beside the setting's own train and evaluate records. So the train and evaluate steps run on a setting
exactly as on the run, skip when unchanged (a stopped sweep resumes: a finished setting is not trained again) and
never touch the run's own records. A setting equal to the run's own config is the run itself (its checkpoints).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import re
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from specops.contract.errors import BadInput
from specops.pipeline.run.config import Run, RunConfig, _describe

SWEPT = ("draft", "train")  # the sections a training sweep varies
NOT_SWEPT = {"train.extra_args": "a list", "train.stop_if": "a mapping"}
# keys outside them whose change makes an earlier step again: that step (data and samples: prepare, or regenerate
# when the run regenerates its answers)
REMAKES = {"model": "regenerate", "embedded": "regenerate", "data": "prepare", "samples": "prepare",
           "max_seq_len": "prepare", "trust_remote_code": "prepare", "evaluate.heldout_prompts": "prepare",
           "regenerate": "regenerate", "layer_ids": "extract", "dtype": "extract", "backend": "extract",
           "hidden_states": "extract", "vllm.serve_args": "extract"}
TRAINING_READS = ("regenerate", "prepare", "extract", "validate", "vocab")  # the recorded steps training reads


@dataclass(frozen=True)
class Setting:
    """One setting of a sweep: `values` (key -> the value as the run config reads it), its `config`."""

    values: dict[str, Any]
    config: RunConfig
    own: bool  # the run's own config: the run itself trains and is scored

    @property
    def label(self) -> str:
        return ", ".join(f"{key}={_text(value)}" for key, value in self.values.items())

    @property
    def folder(self) -> str:
        """Its folder under <run>/sweeps/: the keys and values, in safe characters (hashed when long)."""
        name = re.sub(r"[^A-Za-z0-9._-]", "-", "_".join(f"{key}-{_text(value)}" for key, value in self.values.items()))
        if len(name) > 100:
            name = f"{name[:80]}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"
        return name

    def run_of(self, run: Run) -> Run:
        """The run as this setting: its config, its folders (Run.paths.for_setting); the run itself when own."""
        if self.own:
            return run
        variant = copy.copy(run)
        variant.config = self.config
        variant.paths = run.paths.for_setting(self.folder, own_vocab=self.own_vocab(run))
        variant.label = f"{run.label} (sweep setting {self.label})"
        return variant

    def own_vocab(self, run: Run) -> bool:
        return self.config.draft.vocab_size != run.config.draft.vocab_size


def _text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def refusal(run: Run, key: str) -> str | None:
    """Why a sweep cannot vary `key` of this run config, or None when it can."""
    parts = key.split(".")
    node: Any = run.config
    for depth, part in enumerate(parts):
        if not isinstance(node, BaseModel) or part not in type(node).model_fields:
            known = ".".join(parts[:depth]) or "the run config"
            return f"not a setting of {run.label} ({known} has no key {part!r})"
        node = getattr(node, part)
    remade = REMAKES.get(key) or REMAKES.get(parts[0])
    if remade is not None:
        if remade == "prepare" and parts[0] in ("data", "samples") and run.config.regenerate.enabled:
            remade = "regenerate"
        return (f"changes what the {remade} step made; a sweep never regenerates or re-extracts (every setting "
                "trains from the run's own prepared rows and hidden states): make another run for it")
    if key == "evaluate.num_speculative_tokens":
        return "a setting of the evaluation, not of the training: invoke evaluate --sweep num_speculative_tokens=..."
    if parts[0] not in SWEPT:
        return "not a setting a training sweep varies (draft.* and train.*; the run's own evaluation scores each)"
    if len(parts) != 2:
        return f"name one key of {parts[0]}, such as {parts[0]}.{'lr' if parts[0] == 'train' else 'num_layers'}"
    if key in NOT_SWEPT:
        return f"{NOT_SWEPT[key]}, not one value a setting"
    return None


def _value(text: str) -> Any:
    """A value as the run config's YAML would read it (`1e-3` stays text: pydantic reads numbers from text)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if value is None or isinstance(value, str | int | float | bool) else text


def settings_of(run: Run, sweep: list[tuple[str, list[str]]]) -> list[Setting]:
    """Every setting of the grid of the keys' values, each validated as a run config; bad input (one line naming
    the key and what is wrong, BadInput) before anything trains."""
    for key, _values in sweep:
        problem = refusal(run, key)
        if problem:
            raise BadInput(f"--sweep {key}: {problem}")
    base = run.config.model_dump(mode="python")
    settings: list[Setting] = []
    seen: dict[tuple[Any, ...], str] = {}
    for combination in itertools.product(*[[(key, text) for text in values] for key, values in sweep]):
        raw = copy.deepcopy(base)
        for key, text in combination:
            section, field = key.split(".")
            raw[section][field] = _value(text)
        try:
            config = RunConfig.model_validate(raw)
        except ValidationError as exc:
            given = ", ".join(f"{key}={text}" for key, text in combination)
            raise BadInput(f"--sweep {given}: {_describe(exc.errors()[0])}") from None
        values = {key: getattr(getattr(config, key.split(".")[0]), key.split(".")[1]) for key, _ in combination}
        same = tuple(values.values())
        written = ", ".join(f"{key}={text}" for key, text in combination)
        if same in seen:
            raise BadInput(f"--sweep: {seen[same]} and {written} are the same setting")
        seen[same] = written
        settings.append(Setting(values, config, own=config == run.config))
    return settings


def sync_records(run: Run, variant: Run, own_vocab: bool) -> None:
    """The setting's manifest holds the run's records of the steps training reads (its vocab's own when it has its
    own vocabulary), as they are now: a changed extraction or vocabulary of the run trains the setting again."""
    from specops.pipeline.run.manifest import Manifest

    source, into = Manifest(run.paths.run_dir), Manifest(variant.paths.run_dir)
    for name in TRAINING_READS:
        if name == "vocab" and own_vocab:
            continue
        record = source.record(name)
        if record is None:
            into.steps.pop(name, None)
        else:
            into.steps[name] = copy.deepcopy(record)
    variant.paths.run_dir.mkdir(parents=True, exist_ok=True)
    into.save()
