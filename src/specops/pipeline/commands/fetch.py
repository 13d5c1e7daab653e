"""`python -m specops fetch-list --run NAME`: what `invoke fetch` brings home, with sizes and hashes."""

from __future__ import annotations

import argparse
from typing import Any


def _handle(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.fetch import fetch_list

    return 0, fetch_list(args.run, args.with_training_state)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("fetch-list", help="files `invoke fetch` brings home, with sha256")
    parser.add_argument("--run", required=True)
    parser.add_argument("--with-training-state", action="store_true", help="include optimizer/scheduler state")
    parser.set_defaults(handler=_handle)
