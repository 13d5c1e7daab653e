"""`python -m specops plan --run NAME [--samples N] [--role serve|train]`: what the run will cost on this host,
before any model load (the target's config and safetensors headers, the data's tokens, this host's GPUs and disk).
Exit 0 when the run's hidden-state mode fits, 1 when it does not (the document says why); with --role, whether
this host's part of a role split fits (`role` in the document)."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from specops.contract.commandline import PLAN
from specops.host.paths import workdir


def plan(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """Planned with the serve env the run's jobs will have (--serve-python): its vLLM's loads and live servers."""
    from specops.pipeline.vllm import serving_from

    with serving_from(args.serve_python):
        return _planned(args)


def _planned(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.data import open_run, planned_config
    from specops.pipeline.run import Run, is_gguf

    run = Run(args.run)
    # an embedded GPU-sized target not generated yet is planned from its config, made in memory: plan loads no
    # model and writes nothing large (generating it is the run's first step's work)
    config = planned_config(workdir(), run.config.embedded) if run.config.embedded is not None else None
    if config is None:
        # a GGUF target is planned from its folder's description (config, tokenizer), written without a load
        opened = run.config.embedded is not None or is_gguf(run.config.model)
        return _plan(open_run(args.run, weights=False) if opened else run, args.samples, args.role)
    with tempfile.TemporaryDirectory(prefix="specops-plan-") as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        planned = Run(args.run)
        planned.config = planned.config.model_copy(update={"model": folder})
        code, document = _plan(planned, args.samples, args.role)
    size = document["target"]["weight_bytes"] / 1e9
    document["target_note"] = (f"the embedded target ({run.config.embedded}) is not generated yet: planned from its "
                               f"config; the run's first step generates it (~{size:.1f} GB in {run.model_path})")
    return code, document


def _plan(run: Any, samples: int | None, role: str | None = None) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.plan import plan_for, planned_loads, run_advice
    from specops.planning import role_fit

    made = plan_for(run, samples=samples)
    document = made.to_dict()
    document["advice"] = run_advice(run, made.host.gpus)  # settings known to waste the training: said before it
    # the model loads, timed, with the backend the plan chose for its host
    document["loads"] = planned_loads(run, made.host.gpus, made.target.weight_bytes, made.run.backend)
    if role is not None:  # this host's part of a role split: what it holds is what must fit
        document["role"] = role_fit(made, role)
        return (0 if document["role"]["fits"] else 1), document
    return (0 if document["ok"] else 1), document


def register(subparsers: Any) -> None:
    PLAN.add_to(subparsers, plan)  # flags: specops.contract.commandline.PLAN (the builder's too)
