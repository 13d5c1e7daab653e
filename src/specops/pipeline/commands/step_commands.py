"""`python -m specops step <name> --run NAME ...`: one step of a run on this host.

Each step's flags and cross-flag rules are its spec in specops.contract.commandline (STEPS), the same the control
side's builders are made from; `python -m specops step NAME --help` lists them. One door: every step of the
table goes through the engine as the pipeline does, entered for that step alone on one host
(pipeline.engine.enter: the run's effective settings made once from the run config and this command's
flags, then engine.run_step). `step prepare` and `step extract` first run the steps they read as the
pipeline would (regenerate when the run turns it on, prepare), then their own room's work with their flags.

Each handler returns (exit code, one JSON document); progress for people goes to stderr, which
the job log captures. A run's steps are exclusive on a host (specops.jobs.runlock): a step while
another job or step of the run runs here is refused (exit 2, naming it), or with --wait waits for it.
metrics only reads; extract-shard is a child of the extract that holds the run.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from specops.contract.commandline import STEPS
from specops.contract.errors import BadInput
from specops.jobs.runlock import exclusive
from specops.pipeline import open_run
from specops.pipeline.engine import enter, run_step

if TYPE_CHECKING:
    from specops.pipeline.run import StepContext


def retiring(args: argparse.Namespace) -> None:
    """prepare and extract do not train: rows that would drop a finished training are refused (exit 2, naming
    --retire) unless --retire asks for it (Manifest.retire then says where the results went)."""
    from specops.pipeline.run import GUARD

    GUARD.set(not args.retire)


def step_prepare(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.data import prepare

    retiring(args)
    context = enter(open_run(args.run), args.samples)
    # regenerate first, when the run answers its prompts
    report = run_step("prepare", context, lambda c: prepare(c.run, c.samples, args.strict), reads=True)
    return 0, {"ok": True, "run": args.run, **report}


def step_extract(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline import extraction

    options = extraction.Options(batch_tokens=args.batch_tokens, stop_server=args.stop_server, port=args.port,
                                 processes=args.processes, part=args.part, require_whole=args.require_whole)
    retiring(args)
    # regenerate and prepare as the pipeline runs them, with the run's settings (--backend the run's backend)
    context = enter(open_run(args.run), args.samples, backend=args.backend)
    report = run_step("extract", context, lambda c: extraction.extract(c.run, c.samples, c.backend, options),
                      reads=True)
    return 0, {"ok": True, "run": args.run, **report}


def step_extract_shard(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline import extraction

    return 0, {"ok": True, "run": args.run, **extraction.extract_shard(open_run(args.run), args.shard)}


def step_validate(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.validation import validate

    report = run_step("validate", enter(open_run(args.run)), lambda c: validate(
        c.run, args.fidelity_samples, args.reference, run_backend=c.backend))
    return (0 if report["ok"] else 1), {"run": args.run, **report}


def step_vocab(args: argparse.Namespace) -> tuple[int, dict]:
    from specops.pipeline.run import Run
    from specops.pipeline.training import vocab_step

    return 0, run_step("vocab", enter(Run(args.run)), lambda c: vocab_step(c.run))


def step_train(args: argparse.Namespace) -> tuple[int, dict]:
    from specops.pipeline.hosts import TorchrunNode
    from specops.pipeline.run import Run
    from specops.pipeline.training import train_step

    nodes = None
    if args.nnodes is not None:  # the spec saw --node-rank, --rdzv-id and parsed the endpoint
        nodes = TorchrunNode(args.nnodes, args.node_rank, args.rdzv_endpoint, args.rdzv_id, args.local_addr,
                             args.interface)
        if nodes.problems():
            raise BadInput(nodes.problems()[0])
    if args.sweep is not None:  # never with --nnodes, --epochs, --gpus or --dry-run: the spec's rules
        return _train_sweep(args)
    from specops.pipeline.training_hooks import train_hooks

    codes: list[int] = []

    def work(context: StepContext) -> dict:  # the step's report is its document; its exit code beside it
        code, document = train_step(context.run, args.fresh, args.epochs, args.gpus, args.dry_run, nodes,
                                    **train_hooks(context.run, context.settings))
        codes.append(code)
        return document

    document = run_step("train", enter(Run(args.run)), work)
    return codes[0], document


def _train_sweep(args: argparse.Namespace) -> tuple[int, dict]:
    """`step train --sweep KEY=V1,V2 ...`: every setting trained and scored (pipeline.train_sweep)."""
    from specops.pipeline import train_sweep
    from specops.pipeline.run import Run

    run = Run(args.run)
    settings = train_sweep.check(run, args.sweep)  # its settings first: one line before anything is entered
    document = run_step("train", enter(run), lambda c: train_sweep.sweep(c, settings, fresh=args.fresh))
    around = {key: document.pop(key) for key in ("settings", "vllm_servers") if key in document}  # the command's
    failed = document.get("error")
    return (1 if failed else 0), {"ok": not failed, "run": args.run, "step": "train", "status": "swept",
                                  "sweep": document, **around, **({"error": failed} if failed else {})}


def step_parity(args: argparse.Namespace) -> tuple[int, dict]:
    """The parity gate on its own: the draft training will write (or a checkpoint) against the installed vLLM."""
    from specops.pipeline.vllm import serving

    context = enter(open_run(args.run))  # not a step of the table: the engine's entry for its settings
    with serving(context.run, "step parity"):  # its served check's server ends with it, as a step's does
        return _parity(args, context)


def _parity(args: argparse.Namespace, context: StepContext) -> tuple[int, dict]:
    from specops.pipeline.parity import before_evaluation, before_training, check_servable
    from specops.pipeline.training import train_plan

    run, settings = context.run, context.settings
    # a draft this host's vLLM cannot serve is refused first: it needs no data, and no data would change it
    check_servable(run, settings, asked=args.serve is True,
                   when="before training" if args.checkpoint is None else "before evaluating")
    if args.checkpoint is not None:
        from specops.pipeline.evaluation import choose_checkpoint

        return 0, {"ok": True, "run": args.run, **before_evaluation(
            run, choose_checkpoint(run.paths.checkpoints, args.checkpoint), settings)}
    plan = train_plan(run)
    for needed, step in ((run.paths.prepared / "dataset_info.json", "prepare"), (plan.d2t_path, "vocab")):
        if needed is not None and not needed.exists():  # the dry run reads them: one line, not its traceback
            raise BadInput(f"{needed}: missing; run the {step} step first (invoke {step} --run {args.run})")
    return 0, {"ok": True, "run": args.run, **before_training(run, plan, settings, serve=args.serve)}


def step_metrics(args: argparse.Namespace) -> tuple[int, dict]:
    from specops.pipeline.run import Run
    from specops.pipeline.training import metrics_report

    return 0, metrics_report(Run(args.run), draw_plot=not args.no_plot)


def step_regenerate(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline import regenerate

    run = open_run(args.run)
    if (args.part or args.require_whole) and not run.config.regenerate.enabled:
        return 0, {"ok": True, "run": args.run, "step": "regenerate", "status": "skipped: the run does not regenerate"}

    def work(context: StepContext) -> dict[str, Any]:
        name = context.settings.regenerate_backend  # --backend, else the run's settings
        if args.require_whole:
            return regenerate.require_whole(context.run, name)
        backend = regenerate.backend_for(name, stop_server=args.stop_server, port=args.port)
        return (regenerate.regenerate_share(context.run, backend, args.part) if args.part
                else regenerate.regenerate(context.run, backend))

    report = run_step("regenerate", enter(run, regenerate=args.backend), work)
    return 0, {"ok": True, "run": args.run, **report}


def step_evaluate(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline import evaluation

    run = open_run(args.run)
    if args.sweep is not None:  # --concurrency only with it, never with --all-epochs: the spec's rules
        tokens = evaluation.parse_sweep(args.sweep)  # its values first: one line before the settings are made
        concurrency = evaluation.parse_counts(args.concurrency, "--concurrency") if args.concurrency else None
        document = run_step("evaluate", enter(run, evaluate=args.backend), lambda c: evaluation.sweep(
            c.run, c.settings, tokens, concurrency, args.checkpoint, args.prompts))
        settings = document.pop("settings")  # the command's, beside the sweep (sweep.json is the sweep alone)
        lifetime = document.pop("vllm_servers", None)  # and what became of its servers
        return 0, {"ok": True, "run": args.run, "step": "evaluate", "status": "swept", "sweep": document,
                   "settings": settings, **({"vllm_servers": lifetime} if lifetime else {})}
    if args.compare is not None:  # never with --sweep, --all-epochs or --reproduce: the spec's rules
        labels = evaluation.parse_compare(args.compare)  # its values first: one line before the settings are made
        concurrency = evaluation.parse_counts(args.concurrency, "--concurrency") if args.concurrency else None
        sets = evaluation.parse_pairs(args.sets)
        document = run_step("evaluate", enter(run, evaluate=args.backend), lambda c: evaluation.compare(
            c.run, c.settings, labels, concurrency, args.checkpoint, args.prompts, sets, args.rounds))
        around = {key: document.pop(key) for key in ("settings", "vllm_servers") if key in document}
        return 0, {"ok": True, "run": args.run, "step": "evaluate", "status": "compared", "compare": document,
                   **around}
    if args.reproduce is not None:  # with the record's backend, as the record's evaluation made its settings
        context = enter(run, evaluate=evaluation.recorded_backend(args.reproduce))
        document = run_step("evaluate", context, lambda c: evaluation.reproduce(c.run, c.settings, args.reproduce))
        return (0 if document["reproduced"] else 1), {"ok": document["reproduced"], "run": args.run, **document}
    sets = evaluation.parse_pairs(args.sets)
    report = run_step("evaluate", enter(run, evaluate=args.backend), lambda c: evaluation.evaluate(
        c.run, c.settings, args.checkpoint, args.all_epochs, args.prompts, sets=sets, notes=True))
    return 0, {"ok": True, "run": args.run, **report}


HANDLERS = {"regenerate": exclusive(step_regenerate), "prepare": exclusive(step_prepare),
            "extract": exclusive(step_extract), "extract-shard": step_extract_shard,  # a child of the holder
            "validate": exclusive(step_validate), "vocab": exclusive(step_vocab), "train": exclusive(step_train),
            "evaluate": exclusive(step_evaluate), "parity": exclusive(step_parity),
            "metrics": step_metrics}  # metrics only reads


def register(subparsers: Any) -> None:
    """`step <name>`: each step's flags and rules are its spec in specops.contract.commandline (the builder's too)."""
    step = subparsers.add_parser("step", help="run one pipeline step of a run on this host")
    steps = step.add_subparsers(dest="step", required=True)
    for name, command in STEPS.items():
        command.add_to(steps, HANDLERS[name])
