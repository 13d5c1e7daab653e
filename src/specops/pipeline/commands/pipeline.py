"""`python -m specops pipeline --run NAME`: every step of a run, in order, on this host (engine.py);
with `--hosts A,B --node-rank I --rendezvous HOST0:PORT --group ID`, this host's node of a run across
those hosts (pipeline.hosts); `--only train` enters the engine with the train step alone (invoke train --hosts)."""

from __future__ import annotations

import argparse
from typing import Any

from specops.contract.commandline import PIPELINE
from specops.contract.step_table import sequence
from specops.jobs.runlock import exclusive


def _handle(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline import run_pipeline

    skip = frozenset(["patches"] if args.skip_patches else [])
    alone = {"only": args.only, "epochs": args.epochs, "fresh": args.fresh}
    if not args.hosts:
        return run_pipeline(args.run, args.samples, skip, args.backend, **alone)
    from specops.pipeline.hosts import Rendezvous, TorchrunNode

    # the spec (specops.contract.commandline.PIPELINE) saw the node's flags and parsed --rendezvous into an Endpoint;
    # the training's torchrun meets at the port after it
    endpoint = args.rendezvous
    training = TorchrunNode(len(args.hosts), args.node_rank, endpoint.next_port(), args.group, args.local_addr,
                            args.interface)
    rendezvous = Rendezvous(args.hosts, args.node_rank, endpoint.host, endpoint.port, args.group)
    try:
        return run_pipeline(args.run, args.samples, skip, args.backend, rendezvous, training, **alone,
                            train_hosts=args.train_hosts)
    finally:
        rendezvous.close()


def register(subparsers: Any) -> None:
    """`pipeline`: its flags and rules are PIPELINE in specops.contract.commandline (the builder's too)."""
    PIPELINE.add_to(subparsers, exclusive(_handle), help=f"every step of a run ({sequence()}), each skipped when "
                    "unchanged")
