"""`python -m specops pipeline --run NAME`: every step of a run, in order, on this host (engine.py);
with `--hosts A,B --node-rank I --rendezvous HOST0:PORT --group ID`, this host's node of a run across
those hosts (pipeline.hosts)."""

from __future__ import annotations

import argparse
from typing import Any

from specops.errors import BadInput
from specops.jobs.runlock import exclusive
from specops.steps import sequence


def _handle(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline import run_pipeline

    skip = frozenset(["patches"] if args.skip_patches else [])
    if not args.hosts:
        if args.node_rank is not None or args.rendezvous or args.group or args.local_addr or args.interface:
            raise BadInput("--node-rank/--rendezvous/--group/--local-addr/--interface: only with --hosts")
        return run_pipeline(args.run, args.samples, skip, args.backend)
    from specops.pipeline.hosts import Rendezvous
    from specops.pipeline.run import Training

    names = args.hosts
    if len(names) < 2 or len(set(names)) != len(names) or not all(names):
        raise BadInput(f"--hosts: two or more distinct names, got {','.join(names)!r}")
    if args.node_rank is None or not 0 <= args.node_rank < len(names) or not args.rendezvous or not args.group:
        raise BadInput("--hosts: give --node-rank (0..K-1), --rendezvous HOST0:PORT and --group ID with it")
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
    parser = subparsers.add_parser("pipeline", help=f"every step of a run ({sequence()}), each skipped when "
                                   "unchanged")
    parser.add_argument("--run", required=True)
    parser.add_argument("--samples", type=int, default=None, help="samples to prepare and extract")
    parser.add_argument("--backend", choices=["hf", "vllm"], default=None)
    parser.add_argument("--skip-patches", action="store_true", help="do not apply/verify this host's patch sets")
    parser.add_argument("--hosts", type=lambda text: text.split(","),
                        help="the run's hosts by node rank, comma-separated (a run across hosts)")
    parser.add_argument("--node-rank", type=int, help="this host's place in --hosts (0 hosts the rendezvous)")
    parser.add_argument("--rendezvous", help="HOST0:PORT where the nodes meet (the training meets at PORT+1)")
    parser.add_argument("--group", help="this launch's id, the same on every node")
    parser.add_argument("--local-addr", help="this host's address on the training network")
    parser.add_argument("--interface", help="the interface of the training's collectives")
    parser.add_argument("--wait", action="store_true",
                        help="when another job or step of the run is running here, wait for it instead of refusing")
    parser.set_defaults(handler=exclusive(_handle))
