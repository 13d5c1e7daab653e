"""Agent commands of the vLLM extraction backend: `vllm command|serve|wait|extract`.

- `vllm command --run R [--port N] [--gpus G] [--serve-python P]`: the server's argv and env, as JSON
  (what a `vllm-server` job runs).
- `vllm serve --run R ...`: becomes that server (exec, in the caller's process group), for a job.
- `vllm wait --run R --pgid P [--port N] [--timeout S] [--log F | --job ID]`: the readiness gate.
- `vllm extract --run R [--samples N] [--port N | --endpoint URL] [--validate]`: speculators'
  generate-offline-data against a ready server, then (with --validate) specops' own validation.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from specops.contract.commandline import VLLM_EXTRACT
from specops.contract.errors import BadInput
from specops.contract.values import non_negative_int, positive_int, positive_seconds
from specops.host import gpus
from specops.host.paths import workdir
from specops.jobs.runlock import exclusive
from specops.pipeline import open_run


def _gpus(args: argparse.Namespace) -> int:
    return args.gpus if args.gpus is not None else gpus.smi_count()


def _command(args: argparse.Namespace) -> tuple[Any, list[str], dict[str, str]]:
    from specops.pipeline.vllm import build_serve_command

    run = open_run(args.run)
    port = args.port or run.config.vllm.port
    if args.serve_python is not None and not Path(args.serve_python).is_file():
        raise BadInput(f"--serve-python: {args.serve_python} is not a file")
    argv, env = build_serve_command(run, _gpus(args), port, workdir(), serve_python=args.serve_python)
    return run, argv, env


def vllm_command(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.vllm import staging_dir

    run, argv, env = _command(args)
    return 0, {"ok": True, "run": args.run, "argv": argv, "env": env, "staging": str(staging_dir(run)),
               "layer_ids": run.layer_ids(), "model": str(run.model_path)}


def vllm_serve(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    _, argv, env = _command(args)
    os.execve(argv[0], argv, {**os.environ, **env})  # never returns


def vllm_wait(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.vllm import wait_ready

    run = open_run(args.run)
    port = args.port or run.config.vllm.port
    log = Path(args.log) if args.log else None
    if args.job:
        from specops.jobs import records

        log = Path(records.load(args.job)["log"])
    result = wait_ready(port, args.pgid, log=log, timeout_s=args.timeout)
    return (0 if result["ok"] else 1), {"run": args.run, **result}


def vllm_extract(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.engine import enter, run_step
    from specops.pipeline.extraction import check_endpoint, extract_through

    run = open_run(args.run)
    endpoint = check_endpoint(args.endpoint or f"http://127.0.0.1:{args.port or run.config.vllm.port}/v1")
    context = enter(run, args.samples)  # the steps extract reads first, as `step extract` runs them
    report = run_step("extract", context, lambda c: extract_through(
        c.run, endpoint, c.samples, host_gpus=args.gpus, part=args.part, require_whole=args.require_whole),
        reads=True)
    document = {"ok": True, "run": args.run, **report}
    if args.validate:
        from specops.pipeline.validation import validate

        checked = validate(run, args.fidelity_samples, run_backend=context.backend)
        document["validate"] = checked
        document["ok"] = checked["ok"]
    return (0 if document["ok"] else 1), document


def register(subparsers: Any) -> None:
    vllm = subparsers.add_parser("vllm", help="the vLLM extraction server and client")
    commands = vllm.add_subparsers(dest="vllm_command", required=True)

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--run", required=True)
        parser.add_argument("--port", type=positive_int, help="default: the run's vllm.port")

    def server(parser: argparse.ArgumentParser) -> None:
        common(parser)
        parser.add_argument("--gpus", type=non_negative_int, help="GPUs of this host (default: nvidia-smi -L)")
        parser.add_argument("--serve-python", help="the serve env's python (default: this one)")

    command = commands.add_parser("command", help="the `vllm serve` argv and env for a run, as JSON")
    server(command)
    command.set_defaults(handler=vllm_command)

    serve = commands.add_parser("serve", help="exec the run's extraction server (for a job)")
    server(serve)
    serve.set_defaults(handler=vllm_serve)

    wait = commands.add_parser("wait", help="wait until the run's server answers, or fail with its log")
    common(wait)
    wait.add_argument("--pgid", type=positive_int, required=True, help="the server's process group")
    wait.add_argument("--timeout", type=positive_seconds, default=1800.0, help="seconds (default 1800)")
    source = wait.add_mutually_exclusive_group()
    source.add_argument("--log", help="the server's log file (progress, and the tail on failure)")
    source.add_argument("--job", help="the server's job id (its log is read)")
    wait.set_defaults(handler=vllm_wait)

    VLLM_EXTRACT.add_to(commands, exclusive(vllm_extract))  # flags and rules: specops.contract.commandline.VLLM_EXTRACT
