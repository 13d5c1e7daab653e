"""Evaluation figures from drafting counts, under the key names scripts rely on."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specops.pipeline.run import Acceptance, DraftCounts

REPORT_KEYS = ("mean_acceptance_length", "acceptance_rate", "per_position_acceptance", "num_drafts",
               "num_draft_tokens", "num_accepted_tokens", "prompts", "checkpoint", "backend")


def figures(counts: DraftCounts, prompts: int, checkpoint: str, backend: str) -> Acceptance:
    """mean acceptance length = 1 + accepted / drafts; per position p: drafts accepting p+1 or more / drafts."""
    drafts = counts["num_drafts"]
    draft_tokens = counts["num_draft_tokens"]
    accepted = counts["num_accepted_tokens"]
    return {
        "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else 1.0,
        "acceptance_rate": round(accepted / draft_tokens, 4) if draft_tokens else 0.0,
        "per_position_acceptance": [round(count / drafts, 4) if drafts else 0.0
                                    for count in counts["accepted_per_position"]],
        "num_drafts": drafts, "num_draft_tokens": draft_tokens, "num_accepted_tokens": accepted,
        "prompts": prompts, "checkpoint": checkpoint, "backend": backend,
    }


def with_speed(report: Acceptance, spec_tokens_per_s: float | None, base_tokens_per_s: float | None) -> Acceptance:
    speedup = (round(spec_tokens_per_s / base_tokens_per_s, 3)
               if spec_tokens_per_s and base_tokens_per_s else None)
    return {**report, "tokens_per_s_spec": spec_tokens_per_s, "tokens_per_s_base": base_tokens_per_s,
            "speedup": speedup}


def summary_line(label: str, report: Acceptance) -> str:
    positions = " / ".join(f"{value:.3f}" for value in report["per_position_acceptance"])
    speed = f", speedup {report['speedup']}" if report.get("speedup") else ""
    return (f"{label}: mean acceptance length {report['mean_acceptance_length']:.3f} "
            f"({report['num_accepted_tokens']} of {report['num_draft_tokens']} drafted tokens accepted, "
            f"per position {positions}){speed}")
