"""Which kinds of draft the hf replay can evaluate: it drafts greedily with speculators' Eagle3DraftModel (one token
a step, TTT-style), so its counts are an EAGLE-3 draft's alone. A block kind (dflash, dflash2, dspark) drafts a whole
block from mask tokens in one pass, P-EAGLE in parallel: replayed as EAGLE-3 they would give a number from the wrong
drafting. Those are evaluated through vLLM only, and an evaluation without it says so instead of a figure."""

from __future__ import annotations

REPLAYED = ("eagle3",)


def replay_drafts(kind: str) -> bool:
    """True where the hf replay drafts as a `kind` draft does (eagle3 only)."""
    return kind in REPLAYED


def vllm_only(kind: str) -> str:
    """The line an evaluation without vLLM gives for a kind the replay cannot draft."""
    return (f"vLLM only: a {kind} draft is evaluated through vLLM's server (evaluate.backend: vllm, with a serve "
            "env); the hf replay drafts as EAGLE-3 does and would give a number from the wrong drafting")
