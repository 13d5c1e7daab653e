"""What a person sees of a followed step's log: its lines, less what is not for reading.

- The step's JSON documents (its result, the log's last line) are not shown: the task renders
  them (or prints them as the one document of --json).
- Third-party lines (speculators' loguru records, progress bars of Hugging Face loaders, vLLM's and
  Python's log records and warnings) are not shown: the view is specops' own lines and progress.
  They stay in the job's log (`invoke logs`); should the step fail, its last ones are shown.
- Between the host's trainer markers (specops.contract.protocol.TRAINER_START/END), speculators' raw output
  (three wide INFO lines a step) becomes one rich progress bar per epoch: step, loss, acc@0,
  tokens/s, ETA, and once the epoch is scored its mean acceptance length on held-out prompts
  (TRAINER_ACCEPTANCE). The raw output stays in the job's log (`invoke logs`); should the trainer
  fail, its last lines are shown.
"""

from __future__ import annotations

import json
import re
from collections import deque
from typing import IO, Any

from specops.contract.protocol import (
    TRAINER_ACCEPTANCE,
    TRAINER_END,
    TRAINER_METRIC,
    TRAINER_ONLINE,
    TRAINER_START,
    WAITS_FOR_DATA,
)

# speculators' own epoch bar, printed when an epoch ends: "Epoch 0 100% ━━━ 40/40 [...]"
_EPOCH_BAR = re.compile(r"^Epoch (\d+) .*?(\d+)/(\d+)")
RAW_TAIL_LINES = 30
# Lines that the libraries under the steps print, by their formats (the log keeps them). A library's
# ERROR records stay visible.
THIRD_PARTY = re.compile("|".join((
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[.,]\d+ \| (?:TRACE|DEBUG|INFO|SUCCESS|WARNING) *\| ",  # loguru
    r"\d+%\|[^|]*\| *[\d.]+[kMG]?/[\d.?]+[kMG]? \[",  # tqdm: "Loading weights: 100%|███| 39/39 [00:00<...]"
    r"^(?:vllm: )?(?:\(\w+ pid=\d+\) )?(?:DEBUG|INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d ",  # vLLM's logger
    r"^(?:DEBUG|INFO|WARNING):[\w.]+:",  # logging's default format
)))
_WARNING = re.compile(r"^\S+\.py:\d+: \w*Warning: ")  # Python's warnings; the source line under one goes too


def is_third_party(line: str) -> bool:
    return bool(THIRD_PARTY.search(line) or _WARNING.match(line))


def is_json_document(line: str) -> bool:
    text = line.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return False
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def _width(stream: IO[str]) -> int | None:
    """A terminal's own width; piped, wide enough that a bar's line is printed whole (rich's default, 80
    columns, cut the metrics and the ETA: `67… ETA 0:0…`)."""
    try:
        return None if stream.isatty() else 240
    except (AttributeError, ValueError):
        return 240


class TrainingBars:
    """One bar per epoch, fed the trainer's `key=value` records as they arrive."""

    def __init__(self, stream: IO[str], plan: dict[str, Any]) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.epochs = int(plan.get("epochs") or 0)
        self.estimate = int(plan.get("steps_per_epoch") or 0) or None
        self.epoch_offset = int(plan.get("first_epoch") or 0)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[metrics]}"), TextColumn("ETA"), TimeRemainingColumn(),
                                 console=Console(file=stream, highlight=False, width=_width(stream)),
                                 transient=False)
        self.progress.start()
        self.tasks: dict[int, Any] = {}
        self.pending: dict[str, float] = {}
        self.steps_in_epoch: dict[int, int] = {}
        self.accepted: dict[int, str] = {}  # epoch -> its acceptance, kept on its bar
        self.server: dict[str, Any] | None = None  # online training: the server's side (TRAINER_ONLINE)

    def _task(self, epoch: int) -> Any:
        if epoch not in self.tasks:
            for earlier, task_id in self.tasks.items():  # a new epoch: the earlier bars are complete
                self.progress.update(task_id, total=self.steps_in_epoch.get(earlier, 0) or None,
                                     completed=self.steps_in_epoch.get(earlier, 0))
            self.tasks[epoch] = self.progress.add_task(f"epoch {epoch + 1}/{self.epochs or '?'}",
                                                       total=self.estimate, metrics="")
        return self.tasks[epoch]

    def feed(self, line: str) -> None:
        if line.startswith(TRAINER_ACCEPTANCE):
            self._acceptance(line[len(TRAINER_ACCEPTANCE):])
            return
        if line.startswith(TRAINER_ONLINE):
            try:
                self.server = json.loads(line[len(TRAINER_ONLINE):])
            except json.JSONDecodeError:
                pass
            return
        bar = _EPOCH_BAR.match(line.strip())
        if bar:
            epoch, done, total = (int(part) for part in bar.groups())
            if epoch in self.tasks and total >= done:  # speculators' own count: the true total
                self.progress.update(self.tasks[epoch], total=total)
            return
        for key, value in TRAINER_METRIC.findall(line):
            self.pending[key] = float(value)
            if key == "global_step" and "train/loss" in self.pending:
                self._step(self.pending)
                self.pending = {}
            elif key == "epoch" and any(name.startswith("val/") for name in self.pending):
                self.pending = {}

    def _acceptance(self, text: str) -> None:
        try:
            figures = json.loads(text)
            epoch, length = int(figures["epoch"]), float(figures["mean_acceptance_length"])
        except (ValueError, KeyError, TypeError):
            return
        self.accepted[epoch] = f"  acc.len {length:.3f}"
        if epoch in self.tasks:
            task = self.progress.tasks[self.tasks[epoch]]
            self.progress.update(self.tasks[epoch], metrics=task.fields.get("metrics", "") + self.accepted[epoch])
        else:
            self.progress.console.print(f"epoch {epoch + 1}:{self.accepted[epoch]}")

    def _step(self, record: dict[str, float]) -> None:
        epoch = int(record.get("epoch", 0))
        task_id = self._task(epoch)
        self.steps_in_epoch[epoch] = self.steps_in_epoch.get(epoch, 0) + 1
        done = self.steps_in_epoch[epoch]
        total = self.progress.tasks[task_id].total
        if total is not None and done > total:
            self.progress.update(task_id, total=done)
        metrics = (f"loss {record['train/loss']:.3f}  acc@0 {record.get('train/full_acc_0', float('nan')):.3f}  "
                   f"{record.get('profile/tokens_per_s', float('nan')):.0f} tokens/s")
        if self.server is not None:
            metrics += "  |  " + side_by_side(self.server, record.get("profile/fetch_frac"))
        self.progress.update(task_id, completed=done, metrics=metrics + self.accepted.get(epoch, ""))

    def close(self) -> None:
        for epoch, task_id in self.tasks.items():
            done = self.steps_in_epoch.get(epoch, 0)
            if done:
                self.progress.update(task_id, total=done, completed=done)
        self.progress.stop()


def side_by_side(server: dict[str, Any], fetch_frac: float | None) -> str:
    """The server's side of an online training beside the trainer's, and which one waits: the trainer
    when it spends most of a step waiting for data (speculators' profile/fetch_frac)."""
    served = server.get("served_per_s")
    text = f"server {'?' if served is None else served} hidden states/s"
    if fetch_frac is not None:
        slower = ("the trainer waits for the server" if fetch_frac > WAITS_FOR_DATA
                  else "the server waits for the trainer")
        text += f", trainer waits {100 * fetch_frac:.0f}% of a step: {slower}"
    return text


class StepView:
    """Feeds on the log's text as it streams; writes what a person reads to `stream`."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.partial = ""
        self.bars: TrainingBars | None = None
        self.raw_tail: deque[str] = deque(maxlen=RAW_TAIL_LINES)
        self.hidden_tail: deque[str] = deque(maxlen=RAW_TAIL_LINES)  # third-party lines not shown
        self.after_warning = False
        self.hid_last = False

    def feed(self, text: str) -> None:
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        for line in lines:
            self._line(line)
        self.stream.flush()

    def _line(self, line: str) -> None:
        if line.startswith(TRAINER_START):
            try:
                plan = json.loads(line[len(TRAINER_START):])
            except json.JSONDecodeError:
                plan = {}
            self.bars = TrainingBars(self.stream, plan if isinstance(plan, dict) else {})
            self.raw_tail.clear()
            return
        if self.bars is not None:
            if line.startswith(TRAINER_END):
                self.bars.close()
                self.bars = None
                return
            self.raw_tail.append(line)
            self.bars.feed(line)
            return
        if is_json_document(line):
            return
        source_of_warning = self.after_warning and line.startswith((" ", "\t"))
        self.after_warning = bool(_WARNING.match(line))
        # a blank line after a hidden one: what a progress bar prints when it closes
        self.hid_last = source_of_warning or is_third_party(line) or (self.hid_last and not line.strip(" \r"))
        if self.hid_last:
            self.hidden_tail.append(line)
            return
        self.stream.write(line + "\n")

    def close(self, failed: bool = False) -> None:
        if self.partial:
            self._line(self.partial)
            self.partial = ""
        if self.bars is not None:
            self.bars.close()
            self.bars = None
        if failed and self.raw_tail:  # the trainer failed: what it said last is what a person needs
            self.stream.write("the trainer's last lines (all of them are in the job's log):\n")
            self.stream.write("".join(f"{line}\n" for line in self.raw_tail))
        elif failed and self.hidden_tail:
            self.stream.write("the libraries' last log lines (all of them are in the job's log):\n")
            self.stream.write("".join(f"{line}\n" for line in self.hidden_tail))
        self.stream.flush()
