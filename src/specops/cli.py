"""Entry point of the host agent: `python -m specops <command> ...`.

Every command prints exactly one JSON document on stdout (human text goes to stderr) and exits
0 (ok), 1 (a check failed) or 2 (bad input). Commands live in their own modules; each exposes
`register(subparsers)` which adds a parser whose default `handler(args) -> (exit_code, document)`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from specops.contract.errors import BadInput, CheckFailed

Register = Callable[[Any], None]  # module.register(subparsers)

# One loader per command group. Only the loaders of the command being run are called: importing
# every command module costs ~0.7 s on each agent call. Each loader's `from ... import` is the
# line to repoint when a module moves; a wrong one fails at once (ImportError), never silently.


def _check() -> tuple[Register, ...]:
    from specops import check

    return (check.register,)


def _patch() -> tuple[Register, ...]:
    from specops.patching import commands

    return (commands.register,)


def _doctor() -> tuple[Register, ...]:
    # registered beside the pipeline's commands: with --run the caller makes the run's settings and hands
    # them to the doctor (a leaf, never called back)
    from specops.pipeline.commands import doctor

    return (doctor.register,)


def _job() -> tuple[Register, ...]:
    from specops.jobs import commands

    return (commands.register,)


def _pipeline_steps() -> tuple[Register, ...]:
    from specops.pipeline.commands import step_commands

    return (step_commands.register,)


def _pipeline_commands() -> tuple[Register, ...]:
    from specops.pipeline.commands import runs

    return (runs.register,)


def _pipeline_engine() -> tuple[Register, ...]:
    from specops.pipeline.commands import pipeline

    return (pipeline.register,)


def _fetch_list() -> tuple[Register, ...]:
    from specops.pipeline.commands import fetch

    return (fetch.register,)


def _plan() -> tuple[Register, ...]:
    from specops.pipeline.commands import plan

    return (plan.register,)


def _vllm() -> tuple[Register, ...]:
    from specops.pipeline.commands import vllm

    return (vllm.register,)


def _wheelhouse() -> tuple[Register, ...]:
    from specops.wheelhouse import commands

    return (commands.register,)


COMMANDS: dict[str, Callable[[], tuple[Register, ...]]] = {
    "check": _check,
    "ping": _check,
    "patch": _patch,
    "doctor": _doctor,
    "job": _job,
    "step": _pipeline_steps,
    "tiny": _pipeline_commands,
    "run": _pipeline_commands,
    "pipeline": _pipeline_engine,
    "fetch-list": _fetch_list,
    "vllm": _vllm,
    "plan": _plan,
    "wheelhouse": _wheelhouse,
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors are bad input: exit 2 with JSON
        raise BadInput(f"{self.prog}: {message}")


def registrars(command: str | None = None) -> list[Register]:
    """The register functions for one command; for every command when it is None or unknown (so that
    argparse can name the valid choices)."""
    loaders = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    return list(dict.fromkeys(register for loader in loaders for register in loader()))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for one command (all of them when `command` is None or unknown)."""
    parser = _Parser(prog="specops", description="specops host agent")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for register in registrars(command):
        register(sub)
    return parser


def emit(document: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(document, default=str) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    try:
        argv = sys.argv[1:] if argv is None else argv
        args = build_parser(argv[0] if argv else None).parse_args(argv)
        code, document = args.handler(args)
    except (BadInput, CheckFailed) as exc:
        emit({"ok": False, "error": str(exc), "exit_code": exc.exit_code})
        return exc.exit_code
    except Exception as exc:  # the control side must always get a JSON document
        import traceback  # only here: every agent call starts without it

        emit({"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(),
              "exit_code": 1})
        return 1
    if document is not None:
        emit(document)
    return code
