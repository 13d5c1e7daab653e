"""Acceptance every epoch, and `best` by acceptance.

EpochScorer scores a checkpoint folder on a small fixed held-out set (the first `evaluate.epoch_prompts`
held-out prompts, `evaluate.num_speculative_tokens`, `evaluate.max_tokens`) with the replay: it loads the
target and the prompts once, on the first epoch, and keeps the target's greedy answers and auxiliary states
for every later epoch (they do not depend on the draft). The training room runs it after each epoch while the next one
trains (training.epochs), and records the figures beside the epoch's metrics.

choose_best picks, among the finished epochs, the one with the highest recorded mean acceptance length on
the same prompts and settings (scoring any epoch that has no such record first); ties go to the earlier
epoch (as good, and trained less). The reason goes into the evaluation report.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from specops.contract.progress import speaker
from specops.pipeline.run import Acceptance, Run, config_hash

say = speaker("evaluate")  # progress lines for people (specops.contract.progress)


class EpochScorer:
    def __init__(self, run: Run) -> None:
        self.run = run
        settings = run.config.evaluate
        self.prompts_wanted = settings.epoch_prompts
        self.k = settings.num_speculative_tokens
        self.max_tokens = settings.max_tokens
        self.prompts: list[list[int]] | None = None
        self.target: Any = None
        self.answers: dict[int, list[int]] = {}
        self.states: dict[Any, Any] = {}  # the target's auxiliary states: the same for every epoch too
        self.key: str | None = None
        self._lock = threading.Lock()

    def _load(self) -> None:
        if self.prompts is not None:
            return
        from specops.pipeline.evaluation.prompts import heldout_token_ids

        self.prompts = heldout_token_ids(self.run, self.prompts_wanted)

    def settings_key(self) -> str:
        """What the figures are a function of besides the draft, read without a tokenizer: the prompts'
        source (equal sources give equal token ids), k, max tokens, the backend."""
        if self.key is None:
            from specops.pipeline.evaluation.prompts import prompt_source

            self.key = config_hash({"prompts": prompt_source(self.run, self.prompts_wanted), "k": self.k,
                                    "max_tokens": self.max_tokens, "backend": "hf"})
        return self.key

    def __call__(self, epoch: int, folder: Path) -> Acceptance:
        from specops.pipeline.evaluation.replay import replay
        from specops.pipeline.evaluation.report import figures
        from specops.pipeline.target import choose_device, load_target

        with self._lock:
            self._load()
            assert self.prompts is not None
            if self.target is None:  # on the GPU in bf16 when there is one, as the evaluate step loads it
                self.target = load_target(self.run, *choose_device(self.run.config.dtype))
            counts = replay(self.run, folder, self.prompts, self.k, self.max_tokens, target=self.target,
                            answers=self.answers, states=self.states)
        return {**figures(counts, len(self.prompts), str(epoch), "hf"), "key": self.settings_key()}


def epoch_scorer(run: Run) -> EpochScorer | None:
    """The per-epoch scorer of a run, or None where it has no held-out prompts or turned it off."""
    from specops.pipeline.data import heldout

    if not run.config.evaluate.epoch_prompts or not run.config.evaluate.heldout_prompts:
        return None
    from specops.pipeline.evaluation.kinds import replay_drafts

    if not replay_drafts(run.config.draft.method):  # the replay drafts as EAGLE-3 only: no figure at all
        say(f"acceptance is not measured every epoch: the hf replay does not draft as a {run.config.draft.method} "
            "draft does (the evaluate step measures it through vLLM)")
        return None
    if not heldout.read_prompts(run.paths.heldout):
        say("no held-out prompts: acceptance is not measured every epoch")
        return None
    return EpochScorer(run)


def choose_best(run: Run, folders: list[Path]) -> tuple[Path, dict[str, Any]]:
    """The finished epoch with the highest recorded acceptance, and why (scores unrecorded epochs first)."""
    from specops.pipeline.training import epochs as training_epochs

    save_path = run.paths.checkpoints
    scorer = EpochScorer(run)
    key = scorer.settings_key()
    known = training_epochs.recorded(save_path)
    for folder in folders:
        epoch = int(folder.name)
        if (known.get(epoch) or {}).get("key") != key:
            say(f"epoch {epoch} has no acceptance recorded on these prompts and settings: scoring it")
            training_epochs.record(save_path, epoch, scorer(epoch, folder))
    known = training_epochs.recorded(save_path)
    lengths = {int(folder.name): known[int(folder.name)]["mean_acceptance_length"] for folder in folders}
    best = max(lengths, key=lambda epoch: (lengths[epoch], -epoch))
    figures = known[best]
    others = ", ".join(f"epoch {epoch} {length:.3f}" for epoch, length in sorted(lengths.items()))
    why = (f"epoch {best} has the highest mean acceptance length recorded after training it: "
           f"{lengths[best]:.3f} on {figures.get('prompts')} held-out prompts, k={scorer.k} ({others})")
    return save_path / str(best), {"epoch": best, "by": "mean_acceptance_length", "why": why,
                                   "lengths": {str(epoch): length for epoch, length in sorted(lengths.items())}}
