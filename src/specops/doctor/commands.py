"""`python -m specops doctor`: the installed stack's checks, and with a run the run's checks too.

The doctor never reads a run config: with `--run NAME` its caller (specops.pipeline.commands.doctor, the
command's registration) makes the run's effective settings where the engine is entered and hands them in
as a `RunSettings` value; `--run-json` gives that value directly.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from specops.analysis import ModuleIndex
from specops.contract.errors import BadInput
from specops.doctor import (
    CHECKS,
    SERVE_PYTHON_ENV,
    Item,
    RunSettings,
    chosen_serve_python,
    diagnose,
    parse_run_json,
    quantization_refusal,
    site_path,
)

# (index, search path) -> the patch sets overlaid on the index: [{"set", "patches", "description"}]
Pending = Callable[[ModuleIndex, list[str]], list[dict]]

# the flags, and which go together, are DOCTOR in specops.contract.commandline (the builder's too); their helps:
HELPS = {"checks": f"comma-separated subset of {','.join(CHECKS)} (default: all that apply)"}


def options(args: argparse.Namespace) -> tuple[list[str] | None, str | None]:
    """(the checks asked for, the serve env's interpreter): the command line checked, bad input first, before
    any run is read."""
    for site in args.site:
        if not Path(site).is_dir():
            raise BadInput(f"--site {site}: not a directory")
    checks = None if args.checks is None else [name.strip() for name in args.checks.split(",") if name.strip()]
    if args.no_import:
        from specops.doctor import CHECKS, RUN_CHECKS

        default = CHECKS if (args.run or args.run_json is not None) else tuple(c for c in CHECKS if c not in RUN_CHECKS)
        checks = [name for name in (checks if checks is not None else default) if name != "import"]
    serve_python = chosen_serve_python(args.serve_python)
    if serve_python and not Path(serve_python).is_file():
        raise BadInput(f"{'--serve-python' if args.serve_python else SERVE_PYTHON_ENV} {serve_python}: no such "
                       "interpreter (inventory envs.serve)")
    return checks, serve_python


def handle(args: argparse.Namespace, checks: list[str] | None, serve_python: str | None,
           run: RunSettings | None = None, pending: Pending | None = None) -> tuple[int, dict]:
    """The doctor's document for the checked command line (`options`). `run`: the settings of the run `--run`
    names, made by the caller; `pending` overlays the fitting patch sets not applied yet
    (specops.patching.pending, which imports the doctor), so a run is judged as its patches step will leave
    the code."""
    if args.run_json is not None:
        run = parse_run_json(args.run_json)
        if serve_python and run.serve_python is None:
            run = replace(run, serve_python=serve_python)
    elif args.run and run is None:
        raise BadInput("doctor --run: give the run's settings (this caller read no run config)")
    # the serve env's sets not applied yet are findings either way; only --as-patched judges the code as applied
    document = diagnose(site_path(args.site), run, checks, pending=pending if args.as_patched else None,
                        sets_of=pending)
    if args.run:
        document["run"] = args.run
    # a kind of draft this stack cannot train or serve is the run config's bad input (draft.method): exit 2, not 1
    refused = [item["why"] for item in document.get("findings", [])
               if item["check"] == "draft" and item["result"] == "error"]
    if refused:
        document["refused"] = f"draft.method: {refused[0]}"
        return 2, document
    # a target the envs that load it cannot load is the run's bad input too: one line, before any load
    broken = quantization_refusal([Item(**{k: v for k, v in item.items() if k != "id"})
                                   for item in document.get("findings", [])])
    if broken:
        document["refused"] = document["error"] = broken
        return 2, document
    return (0 if document["ok"] else 1), document
