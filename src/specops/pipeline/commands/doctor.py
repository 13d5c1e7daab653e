"""`python -m specops doctor [--run NAME]`: the doctor's command, registered here because a run is read here.

The doctor is a leaf (it never imports the pipeline, and nothing hands it a callback into the pipeline): with
`--run NAME` this caller makes the run's effective settings at the engine's entry (pipeline.preflight, the
same entry the launched step makes them at: the run config with --backend and the serve env) and hands the
doctor the value. The doctor's own flags are DOCTOR in specops.contract.commandline.
"""

from __future__ import annotations

import argparse
from typing import Any

from specops.contract.commandline import DOCTOR


def doctor(args: argparse.Namespace) -> tuple[int, dict]:
    from specops.doctor import commands

    checks, serve_python = commands.options(args)  # bad flags first, before any run is read
    run = None
    if args.run and args.run_json is None:
        from specops.pipeline.preflight import run_settings

        run = run_settings(args.run, args.backend, serve_python)
    return commands.handle(args, checks, serve_python, run, pending=_pending_patches)


def _pending_patches(index: Any, search_path: list[str]) -> list[dict]:
    from specops.patching.pending import overlay_fitting_sets

    return overlay_fitting_sets(index, search_path)


def register(subparsers: Any) -> None:
    from specops.doctor.commands import HELPS

    DOCTOR.add_to(subparsers, doctor, helps=HELPS)
