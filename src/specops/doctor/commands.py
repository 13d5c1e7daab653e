"""`python -m specops doctor`: preflight checks of the host's packages, model and resources."""

from __future__ import annotations

import argparse
from pathlib import Path

from specops.doctor._run import parse_run
from specops.doctor.checks import CHECKS, run_doctor, site_path
from specops.errors import BadInput


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("doctor", help="check API contracts, flags, capabilities, model config, "
                                                  "resources")
    parser.add_argument("--site", action="append", default=[], metavar="DIR",
                        help="extra site directory searched before sys.path (repeatable)")
    parser.add_argument("--run-json", default=None, metavar="JSON", help="the run's settings as a JSON object")
    parser.add_argument("--run", default=None, metavar="NAME", help="check against runs/NAME.yaml on this host")
    parser.add_argument("--checks", default=",".join(CHECKS),
                        help=f"comma-separated subset of {','.join(CHECKS)} (default: all)")
    parser.add_argument("--no-import", action="store_true",
                        help="skip the import probe (a child python importing the run's packages, no GPU)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> tuple[int, dict]:
    for site in args.site:
        if not Path(site).is_dir():
            raise BadInput(f"--site {site}: not a directory")
    checks = tuple(name.strip() for name in args.checks.split(",") if name.strip())
    for name in checks:
        if name not in CHECKS:
            raise BadInput(f"--checks: unknown check {name!r}; choose from {', '.join(CHECKS)}")
    if args.no_import:
        checks = tuple(name for name in checks if name != "import")
    if args.run and args.run_json:
        raise BadInput("doctor: give --run or --run-json, not both")
    run_json = args.run_json
    if args.run:
        from specops.doctor.from_run import run_settings_json

        run_json = run_settings_json(args.run)
    document = run_doctor(parse_run(run_json, "--run" if args.run else "--run-json"), site_path(args.site), checks)
    if args.run:
        document["run"] = args.run
    return (0 if document["ok"] else 1), document
