"""`python -m specops tiny [--force]` (the embedded tiny target and data) and `run show --run NAME`
(the validated run config and the values derived from it)."""

from __future__ import annotations

import argparse
from typing import Any

from specops.paths import workdir


def tiny(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.data import generate_tiny

    return 0, {"ok": True, **generate_tiny(workdir(), force=args.force)}


def run_show(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops import gpus
    from specops.pipeline.run import Run

    return 0, {"ok": True, **Run(args.run).describe(gpus.device_count())}


def register(subparsers: Any) -> None:
    tiny_parser = subparsers.add_parser("tiny", help="generate the embedded tiny model and data")
    tiny_parser.add_argument("--force", action="store_true", help="regenerate even if present")
    tiny_parser.set_defaults(handler=tiny)

    run = subparsers.add_parser("run", help="run configs")
    run_commands = run.add_subparsers(dest="run_command", required=True)
    show = run_commands.add_parser("show", help="the validated run config and derived values")
    show.add_argument("--run", required=True)
    show.set_defaults(handler=run_show)
