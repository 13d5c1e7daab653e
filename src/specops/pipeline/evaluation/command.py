"""`python -m specops step evaluate --run NAME [--checkpoint best|last|N] [--all-epochs] [--prompts N]
[--backend hf|vllm]`: the draft's acceptance on the held-out prompts, beside the untrained draft's."""

from __future__ import annotations

import argparse
from typing import Any

from specops.pipeline.runs import open_run, positive_int


def _handle(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.evaluation.step import evaluate

    report = evaluate(open_run(args.run), args.checkpoint, args.all_epochs, args.prompts, args.backend)
    return 0, {"ok": True, "run": args.run, **report}


def register(subparsers: Any) -> None:
    from specops.pipeline.train_commands import _step_subparsers

    parser = _step_subparsers(subparsers).add_parser(
        "evaluate", help="acceptance of the draft as the target's EAGLE-3 speculator, on held-out prompts")
    parser.add_argument("--run", required=True)
    parser.add_argument("--checkpoint", default=None, help="best | last | an epoch number (default: the run's)")
    parser.add_argument("--all-epochs", action="store_true", help="score every epoch's checkpoint")
    parser.add_argument("--prompts", type=positive_int, default=None, help="the first N held-out prompts")
    parser.add_argument("--backend", choices=["hf", "vllm"], default=None)
    parser.set_defaults(handler=_handle)
