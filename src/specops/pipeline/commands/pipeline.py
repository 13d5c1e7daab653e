"""`python -m specops pipeline --run NAME`: every step of a run, in order, on this host (driver.py)."""

from __future__ import annotations

import argparse
from typing import Any


def _handle(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline import run_pipeline

    return run_pipeline(args.run, args.samples, args.skip_doctor, args.skip_patches, args.backend)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("pipeline", help="every step of a run, each skipped when unchanged")
    parser.add_argument("--run", required=True)
    parser.add_argument("--samples", type=int, default=None, help="samples to prepare and extract")
    parser.add_argument("--backend", choices=["hf", "vllm"], default=None)
    parser.add_argument("--skip-doctor", action="store_true", help="do not run the doctor first (recorded)")
    parser.add_argument("--skip-patches", action="store_true", help="do not apply/verify this host's patch sets")
    parser.set_defaults(handler=_handle)
