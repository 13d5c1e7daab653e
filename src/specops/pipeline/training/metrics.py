"""Read speculators 0.9.0's training metrics back from its log into steps and a per-epoch table.

The trainer logs one record per logged step (`train/loss=.., train/full_acc_0=.., profile/tokens_per_s=..,
epoch=.., lr..=.., global_step=..`) and one per validation pass (`val/loss_epoch=.., .., epoch=..`)
through a rich console that wraps long records over several lines. Wrapping only ever breaks at spaces,
so the `key=value` tokens survive intact and are read in order, whatever the line breaks.
`### specops launch` lines (written by train.py) separate relaunches; a step replayed after a resume
replaces the earlier record of the same global step.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specops.contract.protocol import TRAINER_METRIC

LAUNCH_MARK = "### specops launch"
_TOKEN = TRAINER_METRIC  # written once, in the protocol: the control side's progress bar reads the same


@dataclass
class Step:
    global_step: int
    epoch: int
    launch: int
    first_of_launch: bool
    train: dict[str, float] = field(default_factory=dict)
    profile: dict[str, float] = field(default_factory=dict)


@dataclass
class Validation:
    epoch: int
    metrics: dict[str, float]


@dataclass
class TrainingLog:
    steps: list[Step]
    validations: list[Validation]
    launches: int


def parse_log(text: str) -> TrainingLog:
    steps: dict[int, Step] = {}
    validations: dict[int, Validation] = {}
    launch = 0
    seen_in_launch = False
    pending: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(LAUNCH_MARK):
            launch += 1
            seen_in_launch = False
            pending = {}
            continue
        for key, value in _TOKEN.findall(line):
            pending[key] = float(value)
            if key == "global_step" and any(name.startswith("train/") for name in pending):
                step = int(pending["global_step"])
                steps[step] = Step(
                    global_step=step, epoch=int(pending.get("epoch", -1)), launch=launch,
                    first_of_launch=not seen_in_launch,
                    train={name[6:]: number for name, number in pending.items() if name.startswith("train/")},
                    profile={name[8:]: number for name, number in pending.items()
                             if name.startswith("profile/")},
                )
                seen_in_launch = True
                pending = {}
            elif key == "epoch" and any(name.startswith("val/") for name in pending):
                metrics = {name[4:].removesuffix("_epoch"): number for name, number in pending.items()
                           if name.startswith("val/")}
                validations[int(value)] = Validation(int(value), metrics)
                pending = {}
    return TrainingLog(sorted(steps.values(), key=lambda step: step.global_step),
                       sorted(validations.values(), key=lambda validation: validation.epoch), launch)


def read_log(path: Path) -> TrainingLog:
    return parse_log(path.read_text(errors="replace") if path.is_file() else "")


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def epoch_table(log: TrainingLog) -> list[dict[str, Any]]:
    """One row per epoch: mean train metrics, validation metrics, median tokens/s and step time.

    Tokens/s leaves out the first step of every launch (compilation, autotuning, cold caches) when
    the epoch has other steps.
    """
    by_epoch: dict[int, list[Step]] = {}
    for step in log.steps:
        by_epoch.setdefault(step.epoch, []).append(step)
    validations = {validation.epoch: validation.metrics for validation in log.validations}
    rows = []
    for epoch in sorted(set(by_epoch) | set(validations)):
        steps = by_epoch.get(epoch, [])
        names = sorted({name for step in steps for name in step.train if name != "error_records"})
        warm = [step for step in steps if not step.first_of_launch] or steps
        speeds = [step.profile["tokens_per_s"] for step in warm if "tokens_per_s" in step.profile]
        times = [step.profile["step_ms"] for step in warm if "step_ms" in step.profile]
        rows.append({
            "epoch": epoch,
            "steps": len(steps),
            "train": {name: _mean([step.train[name] for step in steps if name in step.train]) for name in names},
            "val": validations.get(epoch),
            "tokens_per_s": statistics.median(speeds) if speeds else None,
            "step_ms": statistics.median(times) if times else None,
        })
    return rows


def loss_per_step(log: TrainingLog) -> list[tuple[int, float]]:
    return [(step.global_step, step.train["loss"]) for step in log.steps if "loss" in step.train]
