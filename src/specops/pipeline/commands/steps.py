"""`python -m specops step <name> --run NAME`: one step of a run on this host.

    step regenerate --run R [--backend hf|vllm] [--stop-server] [--port P] [--part I/COUNT] [--require-whole]
                                                     the target answers the prompts (speculators' rows)
    step prepare  --run R [--samples N] [--strict]   tokenise conversations, loss mask, token frequencies
    step extract  --run R [--samples N] [--backend hf|vllm] [--batch-tokens T] [--stop-server] [--port P]
                  [--processes P] [--part I/COUNT] [--require-whole]
    step extract-shard --run R --shard I              one process's batches of a several-process hf extract
    step validate --run R [--fidelity-samples K] [--reference auto|hf|vllm]
    step vocab    --run R                            d2t/t2d + coverage report, skipped when unchanged
    step train    --run R [--fresh] [--epochs E] [--gpus G] [--dry-run]
                  [--nnodes N --node-rank I --rdzv-endpoint HOST0:PORT --rdzv-id ID
                   [--local-addr ADDR] [--interface IF]]
    step evaluate --run R [--checkpoint best|last|N] [--all-epochs] [--prompts N] [--backend hf|vllm]
                  [--sweep num_speculative_tokens=1,2,3 [--concurrency 1,8]]
                                                     acceptance on held-out prompts, trained vs untrained
    step metrics  --run R [--no-plot]                per-epoch table (JSON) and the loss plot
    step parity   --run R [--checkpoint last|N] [--serve|--no-serve]
                                                     the draft config as the installed vLLM reads it vs training

Each handler returns (exit code, one JSON document); progress for people goes to stderr, which
the job log captures. A run's steps are exclusive on a host (specops.jobs.runlock): a step while
another job or step of the run runs here is refused (exit 2, naming it), or with --wait waits for it.
metrics only reads; extract-shard is a child of the extract that holds the run.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from specops.errors import BadInput
from specops.flags import part_of, positive_int
from specops.jobs.runlock import exclusive
from specops.pipeline import open_run

if TYPE_CHECKING:
    from specops.pipeline.run import Run


def _regenerated_first(run: Run, samples: int | None) -> Any:
    """The answers prepare reads, when the run regenerates them: made (or found enough) first, as many
    as prepare's N rows need (N: --samples, else the run's `samples`, else every conversation)."""
    if run.config.regenerate.enabled:
        from specops.pipeline.regenerate import regenerate

        regenerate(run, samples=run.samples_for(samples))
    return run


def step_prepare(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.data import prepare

    report = prepare(_regenerated_first(open_run(args.run), args.samples), args.samples, args.strict)
    return 0, {"ok": True, "run": args.run, **report}


def step_extract(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline import extraction

    options = extraction.Options(batch_tokens=args.batch_tokens, stop_server=args.stop_server, port=args.port,
                                 processes=args.processes, part=args.part, require_whole=args.require_whole)
    if args.part and args.require_whole:
        raise BadInput("--part and --require-whole exclude each other: a share writes, the check does not")
    run = _regenerated_first(open_run(args.run), args.samples)
    report = extraction.extract(run, args.samples, args.backend, options)
    return 0, {"ok": True, "run": args.run, **report}


def step_extract_shard(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline import extraction

    return 0, {"ok": True, "run": args.run, **extraction.extract_shard(open_run(args.run), args.shard)}


def step_validate(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.validation import validate

    report = validate(open_run(args.run), args.fidelity_samples, args.reference)
    return (0 if report["ok"] else 1), {"run": args.run, **report}


def step_vocab(args: argparse.Namespace) -> tuple[int, dict]:
    from specops.pipeline.run import Run
    from specops.pipeline.training import vocab_step

    return 0, vocab_step(Run(args.run))


def step_train(args: argparse.Namespace) -> tuple[int, dict]:
    from specops.pipeline.run import Run
    from specops.pipeline.training import Nodes, train_step

    if args.epochs is not None and args.epochs < 1:
        raise BadInput(f"--epochs: must be at least 1, got {args.epochs}")
    nodes = None
    if args.nnodes is not None:
        if args.node_rank is None or not args.rdzv_endpoint or not args.rdzv_id:
            raise BadInput("--nnodes: give --node-rank, --rdzv-endpoint HOST:PORT and --rdzv-id with it")
        nodes = Nodes(args.nnodes, args.node_rank, args.rdzv_endpoint, args.rdzv_id, args.local_addr, args.interface)
        if nodes.problems():
            raise BadInput(nodes.problems()[0])
    elif args.node_rank is not None or args.rdzv_endpoint or args.rdzv_id or args.local_addr or args.interface:
        raise BadInput("--node-rank/--rdzv-endpoint/--rdzv-id/--local-addr/--interface: only with --nnodes")
    from specops.pipeline.training_hooks import train_hooks

    run = Run(args.run)
    return train_step(run, args.fresh, args.epochs, args.gpus, args.dry_run, nodes, **train_hooks(run))


def step_parity(args: argparse.Namespace) -> tuple[int, dict]:
    """The parity gate on its own: the draft training will write (or a checkpoint) against the installed vLLM."""
    from specops.pipeline.parity import before_evaluation, before_training
    from specops.pipeline.training import train_plan

    run = open_run(args.run)
    if args.checkpoint is not None:
        from specops.pipeline.evaluation import choose_checkpoint

        return 0, {"ok": True, "run": args.run, **before_evaluation(
            run, choose_checkpoint(run.paths.checkpoints, args.checkpoint))}
    from specops.gpus import device_count

    return 0, {"ok": True, "run": args.run, **before_training(run, train_plan(run), device_count(), serve=args.serve)}


def step_metrics(args: argparse.Namespace) -> tuple[int, dict]:
    from specops.pipeline.run import Run
    from specops.pipeline.training import metrics_report

    return 0, metrics_report(Run(args.run), draw_plot=not args.no_plot)


def step_regenerate(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.regenerate import regenerate

    if args.part and args.require_whole:
        raise BadInput("--part and --require-whole exclude each other: a share writes, the check does not")
    run = open_run(args.run)
    if (args.part or args.require_whole) and not run.config.regenerate.enabled:
        return 0, {"ok": True, "run": args.run, "step": "regenerate", "status": "skipped: the run does not regenerate"}
    report = regenerate(run, args.backend, stop_server=args.stop_server, port=args.port, part=args.part,
                        require_whole=args.require_whole)
    return 0, {"ok": True, "run": args.run, **report}


def step_evaluate(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    from specops.pipeline.evaluation import evaluate

    if args.sweep is not None or args.concurrency is not None:
        from specops.pipeline.evaluation import parse_counts, parse_sweep, sweep

        if args.sweep is None:
            raise BadInput("--concurrency: only with --sweep (evaluate sends its prompts one at a time)")
        if args.all_epochs:
            raise BadInput("--sweep and --all-epochs exclude each other: a sweep scores one checkpoint")
        tokens = parse_sweep(args.sweep)
        concurrency = parse_counts(args.concurrency, "--concurrency") if args.concurrency else None
        document = sweep(open_run(args.run), tokens, concurrency, args.checkpoint, args.prompts, args.backend)
        return 0, {"ok": True, "run": args.run, "step": "evaluate", "status": "swept", "sweep": document}
    report = evaluate(open_run(args.run), args.checkpoint, args.all_epochs, args.prompts, args.backend)
    return 0, {"ok": True, "run": args.run, **report}


WAIT_HELP = "when another job or step of the run is running here, wait for it instead of refusing (exit 2)"


def register(subparsers: Any) -> None:
    step = subparsers.add_parser("step", help="run one pipeline step of a run on this host")
    steps = step.add_subparsers(dest="step", required=True)

    regenerate = steps.add_parser("regenerate", help="the target answers the conversations' prompts "
                                  "(resumes after an interruption)")
    regenerate.add_argument("--run", required=True)
    regenerate.add_argument("--backend", choices=["hf", "vllm"], default=None)
    regenerate.add_argument("--stop-server", action="store_true", help="vllm: stop the server job afterwards")
    regenerate.add_argument("--port", type=positive_int, help="vllm: the server's port (default: the run's vllm.port)")
    regenerate.add_argument("--part", type=part_of, metavar="I/COUNT",
                            help="answer only share I of COUNT of the conversations (one host of several)")
    regenerate.add_argument("--require-whole", action="store_true",
                            help="write nothing: exit 1 unless the merged answers cover every conversation, "
                                 "then record the step done")
    regenerate.add_argument("--wait", action="store_true", help=WAIT_HELP)
    regenerate.set_defaults(handler=exclusive(step_regenerate))

    prepare = steps.add_parser("prepare", help="tokenise conversations, loss mask, token frequencies")
    prepare.add_argument("--run", required=True)
    prepare.add_argument("--samples", type=positive_int, help="rows to prepare (default: the run's samples)")
    prepare.add_argument("--strict", action="store_true", help="malformed records are fatal (exit 2)")
    prepare.add_argument("--wait", action="store_true", help=WAIT_HELP)
    prepare.set_defaults(handler=exclusive(step_prepare))

    extract = steps.add_parser("extract", help="capture target hidden states (runs prepare first if needed)")
    extract.add_argument("--run", required=True)
    extract.add_argument("--samples", type=positive_int, help="extract rows 0..N-1 (default: all prepared)")
    extract.add_argument("--backend", choices=["hf", "vllm"])
    extract.add_argument("--batch-tokens", type=positive_int, help="padded tokens per forward batch")
    extract.add_argument("--stop-server", action="store_true",
                         help="vllm: stop the vllm-server job afterwards (default: keep it for the next extract)")
    extract.add_argument("--port", type=positive_int, help="vllm: the server's port (default: the run's vllm.port)")
    extract.add_argument("--processes", type=positive_int,
                         help="hf: processes sharing the rows, one per GPU (default: every GPU; 1 on CPU)")
    extract.add_argument("--part", type=part_of, metavar="I/COUNT",
                         help="write only share I of COUNT hosts (hf: whole batches of the one-host plan; "
                              "vllm: speculators' --rank I --world-size COUNT)")
    extract.add_argument("--require-whole", action="store_true",
                         help="write nothing; exit 1 unless every file of rows 0..N-1 is whole, then "
                              "record the step done")
    extract.add_argument("--wait", action="store_true", help=WAIT_HELP)
    extract.set_defaults(handler=exclusive(step_extract))

    shard = steps.add_parser("extract-shard", help="one process's batches of a several-process hf extract "
                                                   "(started by step extract)")
    shard.add_argument("--run", required=True)
    shard.add_argument("--shard", type=int, required=True)
    shard.set_defaults(handler=step_extract_shard)

    validate = steps.add_parser("validate", help="check hidden-state files and their fidelity")
    validate.add_argument("--run", required=True)
    validate.add_argument("--fidelity-samples", type=positive_int, default=4)
    validate.add_argument("--reference", choices=("auto", "hf", "vllm"), default="auto",
                          help="the target's own next-token choices: a fresh hf forward, the run's vLLM "
                               "server (prompt_logprobs), or auto: vllm when that server is up, else hf")
    validate.add_argument("--wait", action="store_true", help=WAIT_HELP)
    validate.set_defaults(handler=exclusive(step_validate))

    vocab = steps.add_parser("vocab", help="build the draft vocabulary (d2t/t2d) and its coverage report")
    vocab.add_argument("--run", required=True)
    vocab.add_argument("--wait", action="store_true", help=WAIT_HELP)
    vocab.set_defaults(handler=exclusive(step_vocab))

    train = steps.add_parser("train", help="train the draft with speculators (resumes from its checkpoints)")
    train.add_argument("--run", required=True)
    train.add_argument("--fresh", action="store_true", help="move old checkpoints aside and start over")
    train.add_argument("--epochs", type=int, default=None, help="override train.epochs")
    train.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: all nvidia-smi shows)")
    train.add_argument("--dry-run", action="store_true", help="print the command, do not train")
    train.add_argument("--nnodes", type=int, help="one node of a torchrun group over this many hosts")
    train.add_argument("--node-rank", type=int, help="this host's node rank (0 hosts the rendezvous)")
    train.add_argument("--rdzv-endpoint", help="HOST0:PORT of the c10d rendezvous, reachable from every node")
    train.add_argument("--rdzv-id", help="the group launch's id (the same on every node)")
    train.add_argument("--local-addr", help="this host's address on the training network (torchrun binds and "
                       "advertises it; node 0 then hosts the rendezvous)")
    train.add_argument("--interface", help="the interface of the collectives (GLOO_SOCKET_IFNAME, "
                       "NCCL_SOCKET_IFNAME; default: the one holding --local-addr)")
    train.add_argument("--wait", action="store_true", help=WAIT_HELP)
    train.set_defaults(handler=exclusive(step_train))

    evaluate = steps.add_parser("evaluate", help="acceptance of the draft as the target's EAGLE-3 speculator, "
                                "on held-out prompts, beside the untrained draft's")
    evaluate.add_argument("--run", required=True)
    evaluate.add_argument("--checkpoint", default=None, help="best | last | an epoch number (default: the run's)")
    evaluate.add_argument("--all-epochs", action="store_true", help="score every epoch's checkpoint")
    evaluate.add_argument("--prompts", type=positive_int, default=None, help="the first N held-out prompts")
    evaluate.add_argument("--backend", choices=["hf", "vllm"], default=None)
    evaluate.add_argument("--sweep", default=None, metavar="num_speculative_tokens=1,2,3",
                          help="score the checkpoint at each setting (sweep.json, sweep.png)")
    evaluate.add_argument("--concurrency", default=None, metavar="1,8",
                          help="with --sweep and vllm: requests in flight, each a cell")
    evaluate.add_argument("--wait", action="store_true", help=WAIT_HELP)
    evaluate.set_defaults(handler=exclusive(step_evaluate))

    parity = steps.add_parser("parity", help="the train-vs-serve parity gate: the draft config read the way the "
                              "installed vLLM reads it, against what training uses (exit 1 on a mismatch)")
    parity.add_argument("--run", required=True)
    parity.add_argument("--checkpoint", default=None, help="check this checkpoint (last | an epoch number) instead "
                        "of the draft training will write")
    parity.add_argument("--serve", action=argparse.BooleanOptionalAction, default=None,
                        help="one real request with the untrained draft through the run's vLLM server "
                             "(default: on a GPU host or a vllm-backend run with a serve env)")
    parity.add_argument("--wait", action="store_true", help=WAIT_HELP)
    parity.set_defaults(handler=exclusive(step_parity))

    metrics = steps.add_parser("metrics", help="per-epoch training metrics and the loss plot")
    metrics.add_argument("--run", required=True)
    metrics.add_argument("--no-plot", action="store_true", help="only the table (quick, for `invoke status`)")
    metrics.set_defaults(handler=step_metrics)
