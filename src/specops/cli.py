"""Entry point of the host agent: `python -m specops <command> ...`.

Every command prints exactly one JSON document on stdout (human text goes to stderr) and exits
0 (ok), 1 (a check failed) or 2 (bad input). Commands live in their own modules; each exposes
`register(subparsers)` which adds a parser whose default `handler(args) -> (exit_code, document)`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from typing import Any

from specops.errors import BadInput, CheckFailed

# Which modules register each agent command. Only the modules of the command being run are
# imported (importing all of them costs ~0.7 s on every agent call); a module listed here but not
# present is skipped, so features can land one at a time.
COMMANDS: dict[str, tuple[str, ...]] = {
    "check": ("specops.check",),
    "ping": ("specops.check",),
    "patch": ("specops.patching.commands",),
    "doctor": ("specops.doctor.commands",),
    "job": ("specops.jobs.commands",),
    "step": ("specops.pipeline.commands", "specops.pipeline.train_commands", "specops.pipeline.regenerate.command",
             "specops.pipeline.evaluation.command"),
    "tiny": ("specops.pipeline.commands",),
    "run": ("specops.pipeline.commands",),
    "pipeline": ("specops.pipeline.driver",),
    "fetch-list": ("specops.pipeline.fetch",),
    "vllm": ("specops.pipeline.vllm_commands",),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors are bad input: exit 2 with JSON
        raise BadInput(f"{self.prog}: {message}")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for one command (all of them when `command` is None or unknown)."""
    parser = _Parser(prog="specops", description="specops host agent")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    wanted = COMMANDS.get(command or "") or tuple(dict.fromkeys(m for ms in COMMANDS.values() for m in ms))
    for name in dict.fromkeys(wanted):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(sub)
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
        emit({"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(),
              "exit_code": 1})
        return 1
    if document is not None:
        emit(document)
    return code
