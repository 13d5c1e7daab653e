"""`python -m specops pipeline --run NAME`: every step of a run, in order, on this host (engine.py);
with `--hosts A,B --node-rank I --rendezvous HOST0:PORT --group ID`, this host's node of a run across
those hosts (pipeline.hosts)."""

from __future__ import annotations

import argparse
from typing import Any

from specops.commandline import PIPELINE
from specops.errors import BadInput
from specops.jobs.runlock import exclusive
from specops.steps import sequence


def _handle(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline import run_pipeline

    skip = frozenset(["patches"] if args.skip_patches else [])
    if not args.hosts:
        return run_pipeline(args.run, args.samples, skip, args.backend)
    from specops.pipeline.hosts import Rendezvous
    from specops.pipeline.run import Training

    names = args.hosts  # the spec's rules (specops.commandline.PIPELINE) saw the node's flags
    address, _, port = args.rendezvous.rpartition(":")
    if not address or not port.isdigit() or not 0 < int(port) < 65535:
        raise BadInput(f"--rendezvous: expected HOST:PORT (PORT < 65535: the training meets at PORT+1), "
                       f"got {args.rendezvous!r}")
    address = address.strip("[]")
    shown = f"[{address}]" if ":" in address else address
    training = Training(f"{shown}:{int(port) + 1}", args.group, args.local_addr, args.interface)
    rendezvous = Rendezvous(names, args.node_rank, address, int(port), args.group, training)
    try:
        return run_pipeline(args.run, args.samples, skip, args.backend, rendezvous)
    finally:
        rendezvous.close()


def register(subparsers: Any) -> None:
    """`pipeline`: its flags and rules are PIPELINE in specops.commandline (the builder's too)."""
    PIPELINE.add_to(subparsers, exclusive(_handle), help=f"every step of a run ({sequence()}), each skipped when "
                    "unchanged")
