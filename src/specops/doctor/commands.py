"""`python -m specops doctor`: the installed stack's checks, and with a run the run's checks too."""

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
    RunSettings,
    chosen_serve_python,
    diagnose,
    parse_run_json,
    site_path,
)

# runs/NAME.yaml on this host, with the command line's --backend and the serve env -> its settings
SettingsOfRun = Callable[[str, str | None, str | None], RunSettings]
# (index, search path) -> the patch sets overlaid on the index: [{"set", "patches", "description"}]
Pending = Callable[[ModuleIndex, list[str]], list[dict]]


def register(subparsers: argparse._SubParsersAction, settings_of_run: SettingsOfRun | None = None,
             pending: Pending | None = None) -> None:
    """The `doctor` parser. `settings_of_run` reads a named run (the pipeline's preflight, handed in by
    specops.cli so that the doctor never imports the pipeline); without it `--run` is refused. `pending`
    overlays the fitting patch sets not applied yet (specops.patching.pending, handed in likewise: the
    patching package imports the doctor), so a run is judged as its patches step will leave the code."""
    from specops.contract.commandline import DOCTOR

    # the flags, and which go together, are DOCTOR in specops.contract.commandline (the builder's too)
    DOCTOR.add_to(subparsers, lambda args: handle(args, settings_of_run, pending), helps={
        "serve_python": "the serve env's interpreter (inventory envs.serve): vLLM is judged there "
                        f"(default: ${SERVE_PYTHON_ENV}, else this env)",
        "checks": f"comma-separated subset of {','.join(CHECKS)} (default: all that apply)"})


def handle(args: argparse.Namespace, settings_of_run: SettingsOfRun | None = None,
           pending: Pending | None = None) -> tuple[int, dict]:
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
    run = None
    if args.run_json is not None:
        run = parse_run_json(args.run_json)
        if serve_python and run.serve_python is None:
            run = replace(run, serve_python=serve_python)
    elif args.run:
        if settings_of_run is None:
            raise BadInput("doctor --run: this agent cannot read run configs")
        run = settings_of_run(args.run, args.backend, serve_python)
    # the serve env's sets not applied yet are findings either way; only --as-patched judges the code as applied
    document = diagnose(site_path(args.site), run, checks, pending=pending if args.as_patched else None,
                        sets_of=pending)
    if args.run:
        document["run"] = args.run
    return (0 if document["ok"] else 1), document
