"""Agent commands of the pipeline: `step prepare|extract|validate`, `tiny`, `run show`.

Each handler returns (exit code, one JSON document); progress for people goes to stderr, which
the job log captures.
"""

from __future__ import annotations

import argparse
from typing import Any

from specops.errors import BadInput
from specops.paths import workdir
from specops.pipeline.runs import open_run, positive_int, visible_gpus


def _run(args: argparse.Namespace):
    return open_run(args.run)


_positive = positive_int


def step_prepare(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.prepare import prepare

    report = prepare(_run(args), args.samples, args.strict)
    return 0, {"ok": True, "run": args.run, **report}


def step_extract(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    run = _run(args)
    backend = args.backend or run.backend(visible_gpus())
    if backend == "vllm":
        from specops.pipeline.vllm_pipeline import extract_with_server

        report = extract_with_server(run, args.samples, stop_server=args.stop_server, port=args.port)
        return 0, {"ok": True, "run": args.run, **report}
    if args.stop_server or args.port:
        raise BadInput(f"--stop-server/--port: only for the vllm backend (run {args.run} extracts with {backend})")
    from specops.pipeline.extract_hf import extract

    report = extract(run, args.samples, args.batch_tokens)
    return 0, {"ok": True, "run": args.run, "backend": backend, **report}


def step_validate(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.validate import validate

    report = validate(_run(args), args.fidelity_samples, args.reference)
    return (0 if report["ok"] else 1), {"run": args.run, **report}


def tiny(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.tiny import generate

    return 0, {"ok": True, **generate(workdir(), force=args.force)}


def run_show(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.config import Run

    return 0, {"ok": True, **Run(args.run).describe(visible_gpus())}




def register(subparsers: Any) -> None:
    step = subparsers.add_parser("step", help="run one pipeline step of a run on this host")
    steps = step.add_subparsers(dest="step", required=True)

    prepare = steps.add_parser("prepare", help="tokenise conversations, loss mask, token frequencies")
    prepare.add_argument("--run", required=True)
    prepare.add_argument("--samples", type=_positive, help="rows to prepare (default: the run's samples)")
    prepare.add_argument("--strict", action="store_true", help="malformed records are fatal (exit 2)")
    prepare.set_defaults(handler=step_prepare)

    extract = steps.add_parser("extract", help="capture target hidden states (runs prepare first if needed)")
    extract.add_argument("--run", required=True)
    extract.add_argument("--samples", type=_positive, help="extract rows 0..N-1 (default: all prepared)")
    extract.add_argument("--backend", choices=["hf", "vllm"])
    extract.add_argument("--batch-tokens", type=_positive, help="padded tokens per forward batch")
    extract.add_argument("--stop-server", action="store_true",
                         help="vllm: stop the vllm-server job afterwards (default: keep it for the next extract)")
    extract.add_argument("--port", type=_positive, help="vllm: the server's port (default: the run's vllm.port)")
    extract.set_defaults(handler=step_extract)

    validate = steps.add_parser("validate", help="check hidden-state files and their fidelity")
    validate.add_argument("--run", required=True)
    validate.add_argument("--fidelity-samples", type=_positive, default=4)
    validate.add_argument("--reference", choices=("auto", "hf", "vllm"), default="auto",
                          help="the target's own next-token choices: a fresh hf forward, the run's vLLM "
                               "server (prompt_logprobs), or auto: vllm when that server is up, else hf")
    validate.set_defaults(handler=step_validate)

    tiny_parser = subparsers.add_parser("tiny", help="generate the embedded tiny model and data")
    tiny_parser.add_argument("--force", action="store_true", help="regenerate even if present")
    tiny_parser.set_defaults(handler=tiny)

    run = subparsers.add_parser("run", help="run configs")
    run_commands = run.add_subparsers(dest="run_command", required=True)
    show = run_commands.add_parser("show", help="the validated run config and derived values")
    show.add_argument("--run", required=True)
    show.set_defaults(handler=run_show)
