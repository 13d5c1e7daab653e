"""What a run's settings are known to cost in what it learns or how fast it trains, from measurements: the plan
and the doctor say it before a launch, so no one finds out after hours of training. Plain values in, lines out."""

from __future__ import annotations

from dataclasses import dataclass

# Rows a draft trains on below which it learns next to nothing (measured, issue 51: SmolLM2-135M-Instruct with
# 100 rows accepted 1.12 at k=3 against 1.00 untrained; the field's smallest anchor, a speculators EAGLE-3 draft
# on 5,000 ShareGPT rows, accepts 2.02).
FEW_ROWS = 1_000
# Muon's step on a CPU (measured, issue 51, 2-core CPU, SmolLM2-135M, hidden 576, draft vocabulary 8,192): 38-44 s
# of every ~55 s step, 32-40 tokens/s, against 312 tokens/s and a 20 ms optimizer step with AdamW. Below this
# hidden size (the embedded demo's 64) the difference does not show.
MUON_CPU_HIDDEN = 256


@dataclass(frozen=True)
class Advice:
    key: str   # the run config's key the advice is about
    line: str  # what is known and what to set instead


def learning_advice(*, rows: int | None, optimizer: str | None, gpus: int, hidden: int | None,
                    generated_target: bool) -> list[Advice]:
    """`rows`: the rows the draft trains on (None: not known before prepare); `optimizer`: the run's train.optimizer
    (None: speculators' default, Muon in 0.9); `generated_target`: an embedded random-weight target (the demo shows
    the loop, not a useful draft: no advice on its data)."""
    advice = []
    if rows is not None and rows < FEW_ROWS and not generated_target:
        advice.append(Advice("samples", f"{rows} training rows is too little for a draft to learn from: measured, "
                                        "100 rows of SmolLM2-135M accepted 1.12 (k=3) against 1.00 untrained; the "
                                        "field's smallest anchor is 5,000 ShareGPT rows (2.02): train on "
                                        f"{FEW_ROWS:,} or more"))
    if (optimizer or "muon") == "muon" and gpus == 0 and hidden is not None and hidden >= MUON_CPU_HIDDEN:
        named = "train.optimizer: muon" if optimizer else "train.optimizer unset (speculators' default: Muon)"
        advice.append(Advice("train.optimizer", f"{named} is slow on a CPU: measured on 2 cores at hidden 576, its "
                                                "step took 38-44 s of every ~55 s (32-40 tokens/s) against 312 "
                                                "tokens/s with adamw: set train.optimizer: adamw"))
    return advice
