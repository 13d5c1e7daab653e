"""Steps 3 and 4 of a run, with the manifest's books: vocab, train, metrics.

    vocab_step(run)      -> d2t/t2d + coverage report, skipped when unchanged
    train_step(run, ...) -> runs `speculators train` (output streamed to stderr), resumes from checkpoints
    metrics_report(run)  -> per-epoch table and the loss plot
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput, CheckFailed
from specops.contract.protocol import TRAINER_END, TRAINER_START
from specops.host import gpus
from specops.pipeline.training import command as train
from specops.pipeline.training import epochs as epochs_room
from specops.pipeline.training import metrics, online, plot, vocab
from specops.pipeline.training.roles import RemoteServers, RemoteServing

TRAIN_SHARE = 0.9  # speculators' data/train_data_ratio default
DEFAULT_TOTAL_SEQ_LEN = 8192  # speculators' --total-seq-len default

if TYPE_CHECKING:  # the run room needs pydantic; the training benches import this room without it
    from specops.pipeline.hosts import TorchrunNode
    from specops.pipeline.run import Hosts, Manifest, Run, StepContext, StepReport

Gate = Callable[[train.TrainPlan, int], dict[str, Any]]


def _manifest(run: Run) -> Manifest:
    from specops.pipeline.run import Manifest

    return Manifest(run.paths.run_dir)


def _hash(inputs: dict[str, Any]) -> str:
    from specops.pipeline.run import config_hash

    return config_hash(inputs)


def draft_vocab_size(run: Run, target_vocab: int) -> int:
    return min(run.config.draft.vocab_size, target_vocab)


def vocab_step(run: Run) -> StepReport:
    paths = run.paths
    target_vocab = vocab.target_vocab_size(run.model_path)
    size = draft_vocab_size(run, target_vocab)
    if not paths.token_freq.is_file():
        raise BadInput(f"{paths.token_freq}: token frequencies missing; run the prepare step first")
    from specops.pipeline.run import file_sha256

    manifest = _manifest(run)
    inputs = {"draft_vocab": size, "target_vocab": target_vocab,
              "prepare": manifest.inputs_hash("prepare"), "token_freq": file_sha256(paths.token_freq)}
    inputs_hash = _hash(inputs)
    outputs = vocab.outputs_in(paths.vocab, size)
    if manifest.is_current("vocab", inputs_hash) and outputs.d2t.is_file() and outputs.t2d.is_file():
        report = vocab.read_report(outputs.report)
        return {"step": "vocab", "status": "skipped: unchanged", "inputs_hash": inputs_hash,
                "draft_vocab": size, "coverage": report.get("coverage"), "d2t": str(outputs.d2t),
                "t2d": str(outputs.t2d)}
    with manifest.recorded("vocab", inputs_hash, inputs) as outcome:
        report = vocab.build_vocab(paths.token_freq, size, target_vocab, paths.vocab)
        outcome.counts = {"draft_vocab": size, "distinct_tokens_seen": report["distinct_tokens_seen"]}
    for row in report["coverage"]:
        print(f"draft vocab {row['draft_vocab']:>7}: {100 * row['share']:6.2f}% of assistant tokens",
              file=sys.stderr)
    return {"step": "vocab", "status": "done", "inputs_hash": inputs_hash, "draft_vocab": size,
            "coverage": report["coverage"], "d2t": report["d2t"], "t2d": report["t2d"]}


def gpu_count() -> int:
    return gpus.device_count()


def generation_for(run: Run) -> train.Generation | None:
    """Online and hybrid: the trainer asks the run's vllm-server job (on this host, the run's port)."""
    settings = run.config.hidden_states
    if settings.mode == "offline":
        return None
    return train.Generation(f"http://127.0.0.1:{run.config.vllm.port}/v1", settings.request_timeout_s,
                            settings.max_retries, settings.max_consecutive_failures)


def train_plan(run: Run, epochs: int | None = None) -> train.TrainPlan:
    config, paths = run.config, run.paths
    target_vocab = vocab.target_vocab_size(run.model_path)
    size = draft_vocab_size(run, target_vocab)
    outputs = vocab.outputs_in(paths.vocab, size)
    draft = config.draft
    mapped = train.uses_vocab_mapping(draft.method)
    return train.TrainPlan(
        verifier=str(run.model_path),
        trust_remote_code=config.trust_remote_code,
        data_path=paths.prepared,
        hidden_states_path=paths.hidden_states,
        save_path=paths.checkpoints,
        target_layer_ids=train.aux_layer_ids(run.layer_ids(), run.num_layers()),
        draft_vocab_size=size,
        d2t_path=outputs.d2t if mapped else None,
        t2d_path=outputs.t2d if mapped else None,
        # eagle3 and peagle: 1 unless set (eagle3's plan, and so its inputs' hash, as before); the others: the
        # kind's own default in speculators unless set
        num_layers=draft.num_layers if draft.num_layers is not None or draft.method not in ("eagle3", "peagle")
        else 1,
        ttt_steps=draft.ttt_steps,
        epochs=epochs if epochs is not None else config.train.epochs,
        lr=config.train.lr,
        loss_implementation=config.train.loss_implementation,
        draft_attn_impl=config.train.draft_attn_impl or "auto",
        total_seq_len=config.train.total_seq_len,
        optimizer=config.train.optimizer,
        log_freq=config.train.log_freq,
        loader_workers=config.train.loader_workers,
        extra_args=tuple(config.train.extra_args),
        generation=generation_for(run),
        hidden_states_backend=None if config.hidden_states.backend == "file" else config.hidden_states.backend,
        speculator_type=draft.method,
        block_size=draft.block_size,
        num_depths=draft.num_depths,
        num_speculative_steps=draft.num_speculative_steps,
    )


def _train_inputs(run: Run, plan: train.TrainPlan, gpus: int, nodes: TorchrunNode | None, *,
                  relative: bool = True) -> dict[str, Any]:
    """What the training depends on. Paths inside the workdir count relative to it, so a workdir moved or
    copied elsewhere (a new disk, a colleague's copy) is still trained; `relative=False` gives the
    absolute-path inputs that runs trained before this rule recorded."""
    manifest = _manifest(run)
    # Epochs stay out: asking for more epochs continues the same training instead of restarting it.
    # Unset optimizer/log_freq/loader_workers stay out too: runs trained before these settings existed
    # keep their hash (and are not trained again).
    settings = {key: _within(run.paths.workdir, value) if relative else str(value)
                for key, value in vars(replace(plan, epochs=0, generation=None)).items()
                if not (value is None and key in ("optimizer", "log_freq", "loader_workers", "generation",
                                                  "hidden_states_backend", *train.KIND_FLAGS))
                and not (key == "speculator_type" and value == "eagle3")}  # eagle3 runs keep their hash
    inputs = {"plan": settings, "gpus": gpus, "vocab": manifest.inputs_hash("vocab"),
              "extract": manifest.inputs_hash("extract"), "samples": trained_rows(plan)}
    if plan.generation is not None:  # offline runs keep the hash they had before online mode existed
        from specops.pipeline.run import model_digest

        inputs["hidden_states"] = {"mode": run.config.hidden_states.mode, "model_digest": model_digest(run.model_path)}
    if nodes is not None:  # the group's shape is an input; the rendezvous id of one launch is not
        inputs["nodes"] = nodes.count
    return inputs


def _within(workdir: Path, value: object) -> str:
    """A setting as hashed: a path inside the workdir as `./relative/path`, anything else as str()."""
    if isinstance(value, (Path, str)) and os.path.isabs(value):
        relative = os.path.relpath(value, workdir)
        if relative != ".." and not relative.startswith(".." + os.sep):
            return f"./{relative}"
    return str(value)


def first_epoch(state: train.CheckpointState) -> int:
    if state.newest_epoch is None:
        return 0
    return state.newest_epoch if state.mid_epoch_step else state.newest_epoch + 1


def steps_per_epoch(plan: train.TrainPlan) -> int:
    """An estimate for the progress bar: the training split's tokens packed into total_seq_len batches."""
    from specops.pipeline.data import saved

    tokens = sum(saved.column(plan.data_path, "seq_len"))
    return max(1, round(tokens * TRAIN_SHARE / (plan.total_seq_len or DEFAULT_TOTAL_SEQ_LEN)))


def trained_rows(plan: train.TrainPlan) -> int:
    """N, the prepared rows speculators will read; each must have its hidden-state file, or BadInput
    (speculators itself would die deep in its loader on the first missing row)."""
    from specops.pipeline.data import saved

    rows = saved.row_count(plan.data_path)
    if plan.generation is not None:
        return rows  # online and hybrid: the trainer asks the server for rows without a file
    missing = [index for index in range(rows) if not (plan.hidden_states_path / f"hs_{index}.safetensors").is_file()]
    if missing:
        raise BadInput(f"{plan.data_path}: {rows} rows are prepared but {len(missing)} have no hidden states "
                       f"(first: hs_{missing[0]}.safetensors); run `invoke extract --samples {rows}` first")
    return rows


def train_step(run: Run, fresh: bool, epochs: int | None, gpus: int | None, dry_run: bool,
               nodes: TorchrunNode | None = None, *, gate: Gate | None = None,
               scorer: Callable[[], epochs_room.Scorer | None] | None = None,
               planned: dict[str, Any] | None = None,
               peers: Callable[..., str | None] | None = None,
               remote: RemoteServers | None = None) -> tuple[int, dict]:
    """Train (or resume, or skip); with `nodes`, as one node of a torchrun group over several hosts.

    gate(plan, gpus): the parity gate (the parity room), run before anything trains; it raises CheckFailed
    on a mismatch. scorer(): the per-epoch acceptance scorer (the evaluation room), or None where the run
    has no held-out prompts; with it every finished epoch is scored and `train.stop_if` applies.
    planned: the plan's placement of server and trainer for an online or hybrid run (the caller plans).
    peers: across hosts, the engine's rendezvous (`Hosts.gone`): a host that fails or goes silent while the
    trainer runs stops it, and the step fails naming that host (training.peers).
    remote: a role split's train host: the servers it asks run on the serve hosts (training.roles)."""
    # first: the group's pre-launch dry run checks this host's training network before anything else;
    # the host's own settings win, as with thread counts: an operator may know better than the inventory
    collectives = {key: os.environ.get(key, value)
                   for key, value in (train.collectives_environment(nodes) if nodes else {}).items()}
    gpus = gpu_count() if gpus is None else gpus
    plan = train_plan(run, epochs)
    if remote is not None and plan.generation is not None:
        plan = replace(plan, generation=replace(plan.generation, endpoint=remote.endpoint))
    placement = None
    if plan.generation is not None:
        if nodes is not None:
            raise BadInput(f"{run.label}: hidden_states.mode: {run.config.hidden_states.mode} trains on one host "
                           "(its vllm-server job beside the trainer); use offline for a training over hosts")
        placement = remote.placement(gpus) if remote is not None else online.placement_for(run, gpus, planned)
        gpus = len(placement.trainer_gpus)
    command = train.build_train_command(plan, gpus, nodes)
    # what the trainer's numerics are pinned to besides the command (its environment: training.command.PINNED)
    pinned = train.pinned_numerics(train.train_environment())
    document: dict[str, Any] = {"step": "train", "command": command, "pinned": pinned,
                                "save_path": str(plan.save_path)}
    if collectives:
        document["collectives"] = collectives
    if placement is not None:
        document["hidden_states"] = {"mode": run.config.hidden_states.mode, "placement": placement.as_dict()}
    if dry_run:
        return 0, {**document, "status": "dry run"}
    vocab_step(run)  # this room's vocab first when missing or stale (skipped when unchanged: the engine ran it)
    needs = [(plan.d2t_path, "vocab")]
    if plan.generation is None:
        needs.append((plan.hidden_states_path / "hs_0.safetensors", "extract"))
    for needed, step in needs:
        if needed is not None and not needed.exists():
            raise BadInput(f"{needed}: missing; run the {step} step first")
    inputs = _train_inputs(run, plan, gpus, nodes)
    inputs_hash = _hash(inputs)
    manifest = _manifest(run)
    record = manifest.record("train") or {}
    # a run trained before paths counted relative recorded the absolute-path hash: the same inputs
    current = manifest.is_current("train", inputs_hash) or (
        record.get("inputs_hash") is not None
        and manifest.is_current("train", _hash(_train_inputs(run, plan, gpus, nodes, relative=False))))
    # a node of a group counts the epochs on its disk too: only global rank 0 saved them, and the
    # group's checkpoint sync brought them here afterwards; every node must skip together, or the
    # others would wait in a rendezvous no one joins. One host believes its record only with the
    # checkpoints on disk (a folder deleted or moved by hand is trained again, not skipped)
    on_disk = _finished_epochs(train.checkpoint_state(plan.save_path))
    recorded_epochs = record.get("counts", {}).get("epochs", 0)
    trained = max(recorded_epochs, on_disk) if nodes is not None else min(recorded_epochs, on_disk)
    if not fresh and current and trained >= plan.epochs:
        return 0, {**document, "status": "skipped: unchanged", "metrics": metrics_report(run)["epochs"]}
    stop_if = run.config.train.stop_if
    if not fresh and stop_if is not None:  # a draft already stopped stays stopped until its inputs change
        known = epochs_room.recorded(plan.save_path).get(stop_if.epoch)
        line = epochs_room.stop_line(stop_if, stop_if.epoch, known) if known else None
        if line:
            raise CheckFailed(f"{line} (recorded; `invoke train --fresh` or a changed run config trains again)")
    # one node of a group checks for all (the same command): the rendezvous host
    parity = gate(plan, gpus) if gate is not None and (nodes is None or nodes.rank == 0) else None
    serving = (None if placement is None else remote.serving(run, placement) if remote is not None
               else online.serve(run, placement))
    if serving is not None:
        document["hidden_states"]["server"] = serving.describe()
    moved_aside = train.start_fresh(plan.save_path) if fresh else None
    from specops.pipeline.run import TrainCounts

    # a stopped or failed trainer is recorded so (the block ends before the CheckFailed below)
    with manifest.recorded("train", inputs_hash, {**inputs, "command": command, "pinned": pinned}) as outcome:
        set_aside = train.set_aside_incomplete(plan.save_path)
        state = train.checkpoint_state(plan.save_path)
        note = state.resume_note() or "starting fresh"
        print(f"specops: {note}; {' '.join(command)}", file=sys.stderr)
        print(TRAINER_START + json.dumps({"epochs": plan.epochs, "first_epoch": first_epoch(state),
                                          "steps_per_epoch": steps_per_epoch(plan)}), file=sys.stderr, flush=True)
        chosen = scorer() if scorer is not None else None
        if nodes is not None and stop_if is not None:
            print("specops: train.stop_if applies to one-host training; across hosts every epoch runs", file=sys.stderr)
        watch = epochs_room.EpochWatch(plan.save_path, chosen, stop_if if nodes is None else None) if chosen else None
        env = {**os.environ, **collectives} if collectives else None
        if serving is not None:
            env = {**os.environ, **serving.trainer_env()}
        from specops.pipeline.training.peers import PeerWatch

        # one guard a trainer: online and hybrid runs train on one host (refused above with nodes)
        heard = PeerWatch(peers) if peers is not None and nodes is not None else None
        try:
            code = train.run_training(command, plan.save_path, env, watch=watch,
                                      guard=serving.watch if serving is not None else heard)
        finally:
            if serving is not None:
                serving.watch.stop()
            if heard is not None:
                heard.stop()
            print(TRAINER_END, file=sys.stderr, flush=True)
        # the trainer failed by itself: its collective broke, maybe because a host went (named, not the trainer)
        gone = (heard.reason or (heard.cause() if code != 0 else None)) if heard is not None else None
        final = train.checkpoint_state(plan.save_path)
        report = metrics_report(run)
        finished_epochs = _finished_epochs(final)
        stopped = watch.stopped if watch is not None else None
        status = "stopped" if stopped else "done" if code == 0 and not gone else "failed"
        outcome.counts, outcome.status = TrainCounts(epochs=finished_epochs, exit_code=code), status
    document.update(status=status, exit_code=code, resumed=state.as_dict() if state.newest_epoch is not None
                    else None, resume=note, checkpoints=final.as_dict(), moved_aside=str(moved_aside)
                    if moved_aside else None, incomplete_set_aside=set_aside, metrics=report["epochs"],
                    plot=report["plot"], parity=parity,
                    acceptance_errors=watch.errors if watch is not None else None)
    if serving is not None:
        document["hidden_states"]["disk"] = serving.watch.as_dict()
    if isinstance(serving, RemoteServing):
        document["accounting"] = serving.accounting(trained_rows(plan), first_epoch(state), finished_epochs)
    if stopped:
        print(f"specops: {stopped}", file=sys.stderr, flush=True)
        raise CheckFailed(stopped)
    log = plan.save_path / train.LOG_FILE
    if gone:  # stopped by the watch (whatever its exit status: a SIGTERMed trainer may save and exit 0)
        what = ("specops stopped this host's trainer" if heard is not None and heard.reason
                else f"this host's trainer ended too: {online.ended_how(code, None)}")
        raise CheckFailed(f"{gone}; {what}; run the same command to resume from the newest checkpoint (log: {log})")
    if code != 0:
        if serving is not None:
            raise CheckFailed(serving.failure(code, serving.watch.trainer_pid, log))
        raise CheckFailed(f"{online.ended_how(code, None)} (log: {log})")
    return 0, document


def _finished_epochs(state: train.CheckpointState) -> int:
    return (state.newest_epoch + 1) if state.newest_epoch is not None and not state.mid_epoch_step else 0


def metrics_report(run: Run, draw_plot: bool = True, *, log_path: Path | None = None,
                   plot_path: Path | None = None) -> dict[str, Any]:
    """The per-epoch table; with draw_plot also (re)draws loss.png (matplotlib: not for `status`).

    `log_path` and `plot_path` default to the run's train.log and loss.png; `fetch` passes its
    snapshot's copies, so the table and the plot match the log it brings home.
    """
    checkpoints: Path = run.paths.checkpoints
    log_file = log_path or checkpoints / train.LOG_FILE
    log = metrics.read_log(log_file)
    png = plot_path or checkpoints / plot.PLOT_FILE
    accepted = epochs_room.recorded(checkpoints)
    drawn: dict[str, Any] | None = None
    if draw_plot:
        drawn = plot.plot_loss(log, png, run=run.paths.name, acceptance={
            epoch: figures["mean_acceptance_length"] for epoch, figures in accepted.items()
            if figures.get("mean_acceptance_length") is not None})
    state = train.checkpoint_state(checkpoints)
    table = metrics.epoch_table(log)
    for row in table:  # the acceptance measured after the epoch, beside its losses
        if row["epoch"] in accepted:
            row["acceptance"] = {key: accepted[row["epoch"]].get(key) for key in (
                "mean_acceptance_length", "per_position_acceptance", "prompts", "backend")}
    return {"step": "metrics", "run": run.paths.name, "log": str(log_file),
            "launches": log.launches, "steps": len(log.steps), "epochs": table,
            "checkpoints": state.as_dict(), "plot": str(png) if png.is_file() else None, "plot_contents": drawn}


def vocab_pipeline_step(context: StepContext) -> StepReport:
    report = vocab_step(context.run)
    return {**report, "figures": {"coverage": report.get("coverage")}}


def train_pipeline_step(context: StepContext, *, gate: Gate | None = None,
                        scorer: Callable[[], epochs_room.Scorer | None] | None = None,
                        planned: dict[str, Any] | None = None) -> StepReport:
    """The pipeline's train. On a GPU host the run's extraction server holds most of each GPU's memory
    (vLLM's gpu_memory_utilization): an offline trainer needs it back; on CPU it is left for the next
    extract; online and hybrid training keep it up (`planned`: the plan's split or shared GPUs).
    Across hosts: one torchrun node a host, from the newest checkpoint any host holds; the report
    names the host whose trainer saved (c10d's global rank 0), where evaluate runs. `gate` and `scorer`:
    what runs around speculators' trainer (pipeline.training_hooks hands them in)."""
    run, hosts = context.run, context.hosts
    if context.train_ranks:  # a role split: this host serves, or trains against the serve hosts' servers
        from specops.pipeline.training import roles

        if roles.is_serve_host(context):
            return roles.serve_for_trainers(context)
        return roles.train_against_servers(context, lambda remote: train_step(
            run, fresh=context.fresh, epochs=context.epochs, gpus=None, dry_run=False, gate=gate, scorer=scorer,
            planned=planned, remote=remote)[1])
    stopped, took = None, None
    if gpus.device_count() > 0 and run.config.hidden_states.mode == "offline":
        from specops.pipeline.vllm import stop_running, take_over

        stopped = stop_running(run, "the pipeline's training needs the GPUs")
        # a server another run kept, which this run used: its GPU memory is the trainer's now
        took = take_over(run, run.config.vllm.port + hosts.rank, "the pipeline's training needs the GPUs")
    nodes, copied = None, None
    if hosts.count > 1 and context.training is not None:
        nodes = context.training  # this host's torchrun node, made where the engine's command line was read
        if nodes.problems():
            raise BadInput(nodes.problems()[0])
        copied = None if context.fresh else newest_checkpoint_everywhere(run, hosts)
    _code, document = train_step(run, fresh=context.fresh, epochs=context.epochs, gpus=None, dry_run=False,
                                 nodes=nodes, gate=gate, scorer=scorer, planned=planned,
                                 peers=hosts.gone if hosts.count > 1 else None)
    saver = hosts.rank
    if hosts.count > 1:
        links = hosts.all_gather("train-saved", len(list(run.paths.checkpoints.glob("epoch*_end"))))
        if not max(links):
            raise CheckFailed(f"train across {', '.join(hosts.names)}: no host holds a finished checkpoint")
        saver = links.index(max(links))
    return {**document, "saver": saver, **({"saved_on": hosts.names[saver]} if hosts.count > 1 else {}),
            **({"stopped_server": stopped} if stopped else {}), **({"took_over_server": took} if took else {}),
            **({"synced_before": copied} if copied else {})}


def newest_checkpoint_everywhere(run: Run, hosts: Hosts) -> dict[str, Any] | None:
    """Every host resumes from the newest complete checkpoint any of them holds: c10d assigns ranks
    itself and only global rank 0 saves, so the saver of one launch may be another host the next time."""
    folder = run.paths.checkpoints
    newest = hosts.all_gather("train-newest", train.checkpoint_state(folder).newest_epoch)
    known = [epoch for epoch in newest if epoch is not None]
    if not known:
        return None
    epoch = max(known)
    source = newest.index(epoch)
    mine = ([str(path.relative_to(folder)) for path in sorted((folder / str(epoch)).rglob("*")) if path.is_file()]
            if hosts.rank == source else [])
    behind = [name for name, value in zip(hosts.names, newest, strict=True) if value != epoch]
    if not behind:
        return None
    exchanged = hosts.exchange("train-checkpoint", folder, mine, lacking=newest[hosts.rank] != epoch)
    return {"epoch": epoch, "source": hosts.names[source], "copied_to": behind, "bytes": exchanged["bytes"]}
