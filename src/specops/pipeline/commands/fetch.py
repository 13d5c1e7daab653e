"""`python -m specops fetch-list --run NAME [--drop SNAPSHOT]`: a snapshot of what `invoke fetch` brings home."""

from __future__ import annotations

import argparse
from typing import Any


def _handle(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.fetch import drop_snapshot, fetch_list

    if args.drop:
        return 0, drop_snapshot(args.run, args.drop)
    return 0, fetch_list(args.run, args.with_training_state)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("fetch-list", help="files `invoke fetch` brings home, with sha256")
    parser.add_argument("--run", required=True)
    parser.add_argument("--with-training-state", action="store_true", help="include optimizer/scheduler state")
    parser.add_argument("--drop", metavar="SNAPSHOT", help="remove a snapshot the workstation brought home")
    parser.set_defaults(handler=_handle)
