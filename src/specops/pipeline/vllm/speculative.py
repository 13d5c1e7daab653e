"""vLLM's `--speculative-config` for a trained speculators draft of any kind (its config.json says which).

The method each kind is served under is the one vLLM's own speculators loader gives it
(`build_vllm_speculative_config`, vllm/transformers_utils/configs/speculators/base.py, 0.32): eagle3 as eagle3, P-EAGLE
as eagle3 with parallel drafting, dflash and dflash2 as dflash, dspark as dspark. specops serves the target with
the draft beside it (`--speculative-config {"model": DRAFT, ...}`), a path on which vLLM does not apply that loader's
method itself, so it is written here; the parity gate holds it against the installed vLLM's reading of the same
draft (a `method` row) before training and before every evaluation. xpress and mtp drafts have no entry: vLLM
0.32's loader reads neither (the doctor refuses such a run before any step).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specops.contract.errors import BadInput

# kind -> (vLLM's speculative method, the flags its loader adds)
SERVED_AS: dict[str, tuple[str, dict[str, Any]]] = {
    "eagle3": ("eagle3", {}),
    "peagle": ("eagle3", {"parallel_drafting": True}),
    "dflash": ("dflash", {}),
    "dflash2": ("dflash", {}),
    "dspark": ("dspark", {}),
}


def served_method(kind: str) -> str | None:
    """The speculative method specops serves a kind of draft under; None: a kind it does not serve."""
    return SERVED_AS[kind][0] if kind in SERVED_AS else None


def draft_config(draft: Path) -> dict[str, Any]:
    """A draft folder's config.json as a dict; a missing or broken one is one line (the parity gate reads it too)."""
    path = Path(draft) / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{path}: the draft has no config.json") from None
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: not valid JSON (line {exc.lineno})") from None
    if not isinstance(config, dict):
        raise BadInput(f"{path}: not a JSON object")
    return config


def draft_kind(draft: Path) -> str:
    """The kind of a draft folder: `speculators_model_type` of its config.json (eagle3 when unsaid, as vLLM reads)."""
    path = Path(draft) / "config.json"
    kind = draft_config(draft).get("speculators_model_type", "eagle3")
    if not isinstance(kind, str):
        raise BadInput(f"{path}: key speculators_model_type: not a kind of draft")
    return kind


def own_tokens(draft: Path) -> int | None:
    """The tokens the draft was made to propose per step (speculators_config.proposal_methods[0].speculative_tokens;
    block_size - 1 for the block kinds); None when the config does not say."""
    try:
        config = json.loads((Path(draft) / "config.json").read_text())
        tokens = config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else None


def speculative_config(draft: Path, tokens: int | None = None) -> dict[str, Any]:
    """The `--speculative-config` that serves `draft` (a trained checkpoint folder of any kind) as the target's
    speculator, drafting `tokens` tokens a step (None: the draft's own; eagle3 with a k gives exactly what
    `eagle3_config(draft, k)` gives). BadInput (one line) for a kind specops cannot serve through vLLM."""
    kind = draft_kind(draft)
    if kind not in SERVED_AS:
        raise BadInput(f"{draft}: a {kind} draft: vLLM's speculators loader serves {', '.join(sorted(SERVED_AS))} "
                       "drafts only (the doctor refuses such a run before training)")
    method, flags = SERVED_AS[kind]
    own = own_tokens(draft)
    if tokens is None:
        if own is None:
            raise BadInput(f"{draft}/config.json: says no speculative_tokens; give the number of tokens to draft")
        tokens = own
    if kind in BLOCK_KINDS and own is not None and tokens > own:
        raise BadInput(f"{draft}: a {kind} draft drafts at most {own} tokens a step (its block size - 1), not {tokens}")
    return {"method": method, "model": str(draft), "num_speculative_tokens": tokens, **flags}


BLOCK_KINDS = ("dflash", "dflash2", "dspark")  # draft a whole block a step: k is the block's, not the run's


def serving_config(draft: Path, k: int) -> dict[str, Any]:
    """The run's `--speculative-config` for `draft`: k tokens a step (evaluate.num_speculative_tokens) for the kinds
    that draft token by token (eagle3, peagle), the block's own (block_size - 1) for the block kinds."""
    return speculative_config(draft, None if draft_kind(draft) in BLOCK_KINDS else k)
