"""`python -m specops tiny [--shape tiny|1b|8b|kimi|kimi-text|kimi-gpu|kimi-int4] [--force]` (the embedded targets and
data), `run show --run NAME` (the validated run config and the values derived from it) and `run check --run NAME`
(the check every task makes before it launches anything: the config and the values derived from the target)."""

from __future__ import annotations

import argparse
from typing import Any

from specops.contract.commandline import RUN_CHECK, RUN_RESTORE
from specops.host.paths import workdir


def tiny(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.data import generate_shape

    return 0, {"ok": True, **generate_shape(workdir(), args.shape, force=args.force)}


def run_show(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.host import gpus
    from specops.pipeline.run import Run

    return 0, {"ok": True, **Run(args.run).describe(gpus.device_count())}


def run_check(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """Exit 0, or 2 with one line (file, key, what): the config's keys and values, then what needs
    the target's config (layer_ids against its layer count) when the target is on this host. `busy`:
    who holds the run on this host now, if anyone (a step launched now would be refused). Judged with the
    serve env the launched job will have (--serve-python): its vLLM, and the servers that fit it."""
    from specops.pipeline.vllm import serving_from

    with serving_from(args.serve_python):
        return _run_check(args)


def _run_check(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.jobs import runlock
    from specops.pipeline.data import open_run

    run = open_run(args.run, weights=False)  # the embedded tiny target is made here, as the first step would
    document: dict[str, Any] = {"ok": True, "run": args.run, "config_file": run.label}
    holder = runlock.live_holder(args.run)  # a launch would be refused (the launch itself decides)
    if holder is not None:
        document["busy"] = {"error": str(runlock.RunBusy(args.run, holder)), "job": runlock.running_job(holder)}
    if (run.model_path / "config.json").is_file():
        document["layer_ids"] = run.layer_ids()
    from specops.pipeline.plan import later_needs, refuse_unfit

    document["plan"] = refuse_unfit(run)  # a hidden-state mode this host cannot hold: exit 2 before any job
    from specops.pipeline.evaluation import checked_sets

    document["sets"] = checked_sets(run)  # a benchmark set that cannot be read: exit 2 before any job
    from specops.pipeline import vllm
    from specops.pipeline.commands.prelaunch import before_launch, parsed, settings_flags
    from specops.pipeline.engine import enter

    launched = parsed(args.launch) if args.launch else None
    # the settings the launch will run with, made as its own entry makes them (this --backend: the launch's)
    settings = enter(run, backend=args.backend, **settings_flags(launched)).settings
    document["settings"] = settings.describe()  # what the launch will run with: its serve env, its vLLM
    backend = settings.backend  # its port held: exit 2 before any job
    vllm.check_before_run(run, backend, workdir(), rank=args.node_rank or 0,
                          later=later_needs(run, settings.gpus, backend) if args.pipeline else ())
    if args.launch:  # the launch's own checks that need no model (its checkpoint, rows it would retire)
        document["launch"] = before_launch(run, launched, settings)
    return 0, document


def run_restore(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """Bring a retired set (<run>/retired/<stamp>/) back; what is there now of those steps is retired in turn."""
    from specops.jobs import runlock
    from specops.pipeline.run import Manifest, Run

    run = Run(args.run)
    # held while it swaps folders, as a step is: a step started in another terminal meanwhile is refused
    with runlock.held(args.run, "run restore"):
        return 0, {"ok": True, "run": args.run, **Manifest(run.paths.run_dir).restore(args.retired)}


def register(subparsers: Any) -> None:
    tiny_parser = subparsers.add_parser("tiny", help="generate the embedded tiny model and data")
    tiny_parser.add_argument("--force", action="store_true", help="regenerate even if present")
    tiny_parser.add_argument("--shape", choices=("tiny", "1b", "8b", "kimi", "kimi-text", "kimi-gpu", "kimi-int4"),
                             default="tiny",
                             help="1b / 8b: a random Llama at Llama-3.2-1B / Llama-3.1-8B dimensions (GPU hosts); "
                                  "kimi: Kimi-K2.5's layout (wrapper), kimi-text: its DeepSeek-V3 text model alone, "
                                  "kimi-gpu: the wrapper at real MLA width and Kimi's vocabulary (GPU hosts), "
                                  "kimi-int4: kimi with its routed experts int4 compressed-tensors, as published")
    tiny_parser.set_defaults(handler=tiny)

    run = subparsers.add_parser("run", help="run configs")
    run_commands = run.add_subparsers(dest="run_command", required=True)
    show = run_commands.add_parser("show", help="the validated run config and derived values")
    show.add_argument("--run", required=True)
    show.set_defaults(handler=run_show)
    RUN_RESTORE.add_to(run_commands, run_restore)  # flags: specops.contract.commandline.RUN_RESTORE (the builder's too)
    RUN_CHECK.add_to(run_commands, run_check)  # flags: specops.contract.commandline.RUN_CHECK (the builder's too)
