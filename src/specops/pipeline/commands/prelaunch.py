"""`run check --run R -- <agent command>`: the checks of the command about to be launched that need no model
and no job, made before the launch (exit 2, one line): the rows `step prepare|extract` would prepare against
a finished training (retired only with --retire; a pipeline retires it, saying where, as it trains again),
the checkpoint evaluate names, its sweep and concurrency values, a training sweep's settings. The job makes them
again (the same functions); here they come before anything is started."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from specops.contract.commandline import PIPELINE, STEPS
from specops.contract.errors import BadInput
from specops.pipeline.run import EffectiveSettings, Run


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # the launch's own usage error: bad input, exit 2
        raise BadInput(f"{self.prog}: {message}")


def parsed(argv: list[str]) -> argparse.Namespace | None:
    """The launch's argv read by its own spec's parser (None: a command with no checks here)."""
    words = argv[1:] if argv[:1] == ["--"] else argv
    if words[:1] == ["pipeline"]:
        spec, rest = PIPELINE, words[1:]
    elif words[:1] == ["step"] and len(words) > 1 and words[1] in STEPS:
        spec, rest = STEPS[words[1]], words[2:]
    else:
        return None
    parser = _Parser(prog="specops " + " ".join(spec.words))
    spec.add_to(parser.add_subparsers(dest="command", parser_class=_Parser), lambda args: None)
    args = parser.parse_args([spec.words[-1], *rest])
    args.command = " ".join(spec.words)
    return args


def settings_flags(args: argparse.Namespace | None) -> dict[str, str | None]:
    """The launched step's own --backend, as its entry hands it to the settings (pipeline.engine.enter): regenerate's
    and evaluate's name their step's backend; the run's backend is run check's own --backend."""
    if args is None or args.command not in ("step regenerate", "step evaluate"):
        return {}
    return {args.command.split()[1]: args.backend}


def before_launch(run: Run, args: argparse.Namespace | None, settings: EffectiveSettings) -> dict[str, Any]:
    """Exit 2 (BadInput) on what the launch would be refused for anyway; else what was checked. `args`: the
    launch read by its own spec (parsed); `settings`: the run's, as the launch's entry makes them."""
    if args is None:
        return {"checked": []}
    checked: list[str] = []
    if args.command in ("step prepare", "step extract") and not args.retire:
        retiring_rows(run, args.samples, covering=args.command == "step extract")
        checked.append("rows")
    if args.command == "step evaluate":
        evaluation_values(run, args, settings)
        checked.append("checkpoint")
    if args.command == "step train" and args.sweep is not None:
        from specops.pipeline.train_sweep import check

        check(run, args.sweep)  # every setting against the run config, and what they train from
        checked.append("sweep")
    return {"checked": checked}


def retiring_rows(run: Run, samples: int | None, *, covering: bool) -> None:
    """Rows prepared again for this N would drop a finished training: refused (the command has no --retire)."""
    from specops.pipeline.data import remakes, retired_by_prepare
    from specops.pipeline.run import GUARD, Manifest

    same_source, remake = remakes(run, run.samples_for(samples), covering)
    if remake:
        token = GUARD.set(True)
        try:
            Manifest(run.paths.run_dir).refuse_retiring(retired_by_prepare(same_source), "prepare")
        finally:
            GUARD.reset(token)


def evaluation_values(run: Run, args: argparse.Namespace, settings: EffectiveSettings) -> None:
    """The checkpoint evaluate names (best: any finished one), --sweep and --concurrency."""
    from specops.pipeline.evaluation import choose_checkpoint, parse_counts, parse_sweep

    if getattr(args, "reproduce", None):  # the record names its checkpoint: evaluate itself reads it
        return
    which = args.checkpoint or run.config.evaluate.checkpoint
    choose_checkpoint(run.paths.checkpoints, "last" if which == "best" else which)
    if args.sweep is not None:
        parse_sweep(args.sweep)
        concurrency = parse_counts(args.concurrency, "--concurrency") if args.concurrency else [1]
        if concurrency != [1] and settings.evaluate_backend == "hf":
            raise BadInput("--concurrency: the hf backend replays the drafting and measures acceptance only "
                           "(no requests in flight); use --backend vllm for speed at several concurrencies")
