"""`python -m specops fetch-list --run NAME [--drop SNAPSHOT]`: a snapshot of what `invoke fetch` brings home."""

from __future__ import annotations

import argparse
from typing import Any

from specops.contract.commandline import FETCH_LIST


def _handle(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.fetch import drop_snapshot, fetch_list

    if args.drop:
        return 0, drop_snapshot(args.run, args.drop)
    return 0, fetch_list(args.run, args.with_training_state)


def register(subparsers: Any) -> None:
    FETCH_LIST.add_to(subparsers, _handle)  # flags: specops.contract.commandline.FETCH_LIST (the builder's too)
