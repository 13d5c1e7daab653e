"""`python -m specops step regenerate --run NAME [--backend hf|vllm] [--stop-server] [--port P]`."""

from __future__ import annotations

import argparse
from typing import Any

from specops.pipeline.runs import open_run, positive_int


def _handle(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.regenerate.step import regenerate

    report = regenerate(open_run(args.run), args.backend, stop_server=args.stop_server, port=args.port)
    return 0, {"ok": True, "run": args.run, **report}


def register(subparsers: Any) -> None:
    from specops.pipeline.train_commands import _step_subparsers

    parser = _step_subparsers(subparsers).add_parser(
        "regenerate", help="the target answers the conversations' prompts (resumes after an interruption)")
    parser.add_argument("--run", required=True)
    parser.add_argument("--backend", choices=["hf", "vllm"], default=None)
    parser.add_argument("--stop-server", action="store_true", help="vllm: stop the server job afterwards")
    parser.add_argument("--port", type=positive_int, help="vllm: the server's port (default: the run's vllm.port)")
    parser.set_defaults(handler=_handle)
