"""`python -m specops plan --run NAME [--samples N]`: what the run will cost on this host, before any model
load (the target's config and safetensors headers, the data's tokens, this host's GPUs and disk).
Exit 0 when the run's hidden-state mode fits, 1 when it does not (the document says why)."""

from __future__ import annotations

import argparse
from typing import Any

from specops.commandline import PLAN


def plan(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.data import open_run
    from specops.pipeline.plan import plan_for

    run = open_run(args.run)
    made = plan_for(run, samples=args.samples)
    document = made.to_dict()
    from specops.pipeline.plan import planned_loads

    document["loads"] = planned_loads(run, made.host.gpus, made.target.weight_bytes)  # the model loads, timed
    return (0 if document["ok"] else 1), document


def register(subparsers: Any) -> None:
    PLAN.add_to(subparsers, plan)  # flags: specops.commandline.PLAN (the builder's too)
