"""The `evaluate` step: score a checkpoint (or every epoch) and the untrained draft on held-out prompts.

evaluate(run, checkpoint="best"|"last"|"N", all_epochs, prompts, backend) ->
<run>/evaluation/report.json {"report": trained figures, "untrained": ..., "previous": the last
evaluation recorded in the manifest, "epochs": [per-epoch figures with --all-epochs]}, and
acceptance.png beside loss.png in the checkpoints folder. <run>/evaluation/progress.json says
which draft is being scored (for `invoke status`). Skipped when the same inputs were scored. The
untrained draft is scored once per draft, prompts and settings: another checkpoint of the same
training reuses its figures ("reused": true), and with vLLM starts one server less.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from specops.contract.errors import BadInput
from specops.contract.progress import speaker
from specops.host import atomic
from specops.pipeline.evaluation.kinds import replay_drafts, vllm_only
from specops.pipeline.evaluation.prompts import RENDER_SOURCE, heldout_token_ids, prompt_source
from specops.pipeline.run import Acceptance, EffectiveSettings, Run, StepContext, StepReport, config_hash

__all__ = ["RENDER_SOURCE", "evaluate", "evaluate_inputs", "heldout_token_ids", "prompt_source"]

REPORT_FILE = "report.json"
PROGRESS_FILE = "progress.json"
HISTORY = 20
# The untrained draft's figures by (its digest, prompts, k, max tokens, backend, serve args): kept in the
# manifest beside the history (the evaluation folder goes when the inputs change), so evaluating
# another checkpoint of the same training scores the untrained draft once. With vLLM that is one
# server load less per evaluation (minutes to tens of minutes for a large target).
UNTRAINED_SCORES = "untrained_scores"
UNTRAINED_KEPT = 8


say = speaker("evaluate")


def _progress(run: Run, **fields: Any) -> None:
    atomic.write_json(run.paths.evaluation / PROGRESS_FILE, {"step": "evaluate", "updated_at": time.time(), **fields})


def _digest(folder: Path) -> str:
    from specops.pipeline.run import file_digest

    return file_digest(folder / "model.safetensors")


class Scorer:
    """Scores drafts with one backend, keeping what can be shared (the target, the base speed)."""

    def __init__(self, run: Run, backend: str, prompts: list[list[int]]) -> None:
        self.run = run
        self.backend = backend
        self.prompts = prompts
        self.k = run.config.evaluate.num_speculative_tokens
        self.max_tokens = run.config.evaluate.max_tokens
        self.target = None
        self.answers: dict[int, list[int]] = {}  # hf: the target's greedy answers, shared by every draft
        self.states: dict[Any, Any] = {}  # hf: and its auxiliary hidden states
        self.base_tokens_per_s: float | None = None
        self.servers: list[dict[str, Any]] = []
        self.baseline: dict[str, Any] | None = None  # where the target-alone speed came from (vllm)
        # vllm, evaluate.baseline_server: the benchmark sets (NAME: FILE, the first `set_limit` of each) whose turns
        # the target alone also answers on its own server, and its rate on each (the sets' speedups)
        self.sets: dict[str, Path] = {}
        self.set_limit: int | None = None
        self.set_baselines: dict[str, dict[str, Any]] = {}
        # vllm: the target alone on a server of its own (the run's effective baseline_server; the config's when
        # no settings were resolved)
        self.baseline_server = run.config.evaluate.baseline_server is True
        self.total = 0
        self.done = 0

    def score(self, folder: Path, label: str, backend: str | None = None) -> Acceptance:
        from specops.pipeline.evaluation.report import figures, with_speed

        backend = backend or self.backend
        _progress(self.run, state="running", draft=label, backend=backend, prompts=len(self.prompts),
                  done=self.done, total=self.total)
        self.done += 1
        if backend == "hf":
            from specops.pipeline.evaluation.replay import replay
            from specops.pipeline.target import choose_device, load_target

            if self.target is None:  # on the GPU when there is one (bf16): the replay follows the target
                self.target = load_target(self.run, *choose_device(self.run.config.dtype))
            counts = replay(self.run, folder, self.prompts, self.k, self.max_tokens, target=self.target,
                            answers=self.answers, states=self.states)
            return {**figures(counts, len(self.prompts), label, "hf"), "generated_tokens": counts["generated_tokens"]}
        from specops.pipeline.evaluation.served import run_prompts
        from specops.pipeline.vllm import generating_server, serving_config

        if self.base_tokens_per_s is None and self.baseline is None:
            self.baseline = self.target_alone()
            self.base_tokens_per_s = self.baseline.get("tokens_per_s")
        # the draft's kind says how it is served (eagle3: k tokens a step, as always; a block kind: its block's)
        speculative = serving_config(folder, self.k)
        server = generating_server(self.run, speculative=speculative)
        self.servers.append(server)
        result = run_prompts(server["endpoint"], server["model"], self.prompts, self.max_tokens,
                             speculative["num_speculative_tokens"], speculative=True)
        counts = result["per_request"] or result["counters"]
        report = figures(counts, len(self.prompts), label, "vllm")
        return {**with_speed(report, result["tokens_per_s"], self.base_tokens_per_s),
                "speedup_baseline": self.baseline,
                "counts_from": "per_request" if result["per_request"] else "metrics_deltas",
                "server_counters": result["counters"], "generated_tokens": result["generated_tokens"]}


    def target_alone(self) -> dict[str, Any]:
        """The target alone's tokens/s for the speedup: by a server of its own when the run asks
        (evaluate.baseline_server), else as measured during extract on the run's server (no load here),
        else not measured."""
        from specops.pipeline.evaluation.served import run_prompts
        from specops.pipeline.vllm import baseline, generating_server, serve_env

        _, version = serve_env()
        asked = self.baseline_server  # a dedicated server, even where extract measured one
        known = baseline.recorded(self.run, self.prompts, self.max_tokens, version)
        # regenerate's own server is the target alone, as a dedicated one is: its rates serve even where one is
        # asked, when it measured every set scored here too
        on_sets = (baseline.recorded_sets(self.run, known, self.sets, self.set_limit, self.max_tokens, version)
                   if known is not None else None)
        if known is not None and (not asked or (known.get("plain") and on_sets is not None)):
            say(f"the target alone: {known['tokens_per_s']} tokens/s, measured on {known['how']}")
            self.set_baselines = on_sets or {}
            for name, measured in self.set_baselines.items():
                say(f"the target alone on set {name}: {measured['tokens_per_s']} tokens/s")
            return {key: known[key] for key in ("tokens_per_s", "how", "job", "prompts", "max_tokens")}
        if not asked:
            why = ("not measured: no target-alone rate from the run's extraction server for these prompts and "
                   "settings (extract did not serve them), and no server of its own (evaluate.baseline_server)")
            say(f"speedup {why}")
            return {"tokens_per_s": None, "how": why}
        base = generating_server(self.run)
        self.servers.append(base)
        rate = run_prompts(base["endpoint"], base["model"], self.prompts, self.max_tokens, self.k,
                           speculative=False)["tokens_per_s"]
        how = f"a server of its own (job {base['job']}, evaluate.baseline_server)"
        if self.sets:  # while this server is up: no load of its own for the sets' baselines
            from specops.pipeline.evaluation.benchmarks import target_alone_on_sets

            self.set_baselines = target_alone_on_sets(self.run, base, self.sets, self.set_limit, self.k,
                                                      self.max_tokens, how)
            for name, measured in self.set_baselines.items():
                say(f"the target alone on set {name}: {measured['tokens_per_s']} tokens/s")
        return {"tokens_per_s": rate, "how": how}


def evaluate_inputs(run: Run, folders: list[Path], prompts: Any, backend: str) -> dict[str, Any]:
    """The step's inputs; `prompts`: the prompts' token ids (or, for the quick check, their source)."""
    from specops.pipeline.run import Manifest

    settings = run.config.evaluate
    from specops.pipeline.run import file_digest

    # the config too: vLLM reads it (the auxiliary layers, the flags), and the parity gate checks it
    return {"drafts": {folder.name: _digest(folder) for folder in folders},
            "configs": {folder.name: file_digest(folder / "config.json") for folder in folders},
            "prompts": config_hash(prompts),
            "k": settings.num_speculative_tokens, "max_tokens": settings.max_tokens, "backend": backend,
            "train": Manifest(run.paths.run_dir).inputs_hash("train")}


def chosen_checkpoint(run: Run, which: str) -> tuple[Path, dict[str, Any] | None]:
    """The checkpoint folder that best | last | N names, and with best why it is the best: by the
    acceptance recorded after each epoch (scored now where missing)."""
    from specops.pipeline.evaluation.drafts import choose_checkpoint, epoch_folders

    if which != "best":
        return choose_checkpoint(run.paths.checkpoints, which), None
    if not replay_drafts(run.config.draft.method):  # best by acceptance needs the replay: by validation loss instead
        chosen = choose_checkpoint(run.paths.checkpoints, "last")
        best_by_loss = run.paths.checkpoints / "checkpoint_best"  # speculators' own pointer (lowest validation loss)
        if best_by_loss.is_dir():
            chosen = best_by_loss.resolve()
        why = (f"epoch {chosen.name}: speculators' checkpoint_best (lowest validation loss); acceptance every epoch "
               f"needs the hf replay, which does not draft as a {run.config.draft.method} draft does")
        say(why)
        return chosen, {"why": why, "by": "validation loss"}
    from specops.pipeline.evaluation.epochs import choose_best

    finished = epoch_folders(run.paths.checkpoints)
    if not finished:
        choose_checkpoint(run.paths.checkpoints, which)  # the one line: no finished checkpoint
    chosen, best = choose_best(run, finished)
    say(best["why"])
    return chosen, best


def evaluate(run: Run, run_settings: EffectiveSettings, checkpoint: str | None = None, all_epochs: bool = False,
             prompts: int | None = None, sets: dict[str, str] | None = None, exact_sets: bool = False,
             again: bool = False, notes: bool = False) -> StepReport:
    """`run_settings`: the run's effective settings, made where the engine was entered (with the command's
    --backend); `notes`: say what their resolution changed (the pipeline said it at its start). `sets`:
    benchmark sets (NAME: FILE) on top of evaluate.sets (`exact_sets`: only these); `again`: evaluate even when
    the same inputs were scored (--reproduce)."""
    from specops.pipeline.evaluation.benchmarks import chosen_sets, set_digests
    from specops.pipeline.evaluation.drafts import UNTRAINED, epoch_folders, untrained_draft
    from specops.pipeline.evaluation.plot import PLOT_FILE, plot_acceptance
    from specops.pipeline.evaluation.report import summary_line
    from specops.pipeline.run import EvaluateCounts, Manifest, package_versions

    effective = run_settings
    if notes:
        for note in effective.notes:
            say(note)
    settings = run.config.evaluate
    backend = effective.evaluate_backend
    kind = run.config.draft.method
    if backend == "hf" and not replay_drafts(kind):
        say(vllm_only(kind))  # never a figure from the wrong drafting
        return {"step": "evaluate", "status": "vLLM only", "vllm_only": vllm_only(kind), "method": kind,
                "report": {"mean_acceptance_length": None, "method": kind, "backend": "hf",
                           "vllm_only": vllm_only(kind)}}
    chosen, best = chosen_checkpoint(run, checkpoint or settings.checkpoint)
    folders = epoch_folders(run.paths.checkpoints) if all_epochs else [chosen]
    manifest = Manifest(run.paths.run_dir)
    report_path = run.paths.evaluation / REPORT_FILE
    # A re-run decides without a tokenizer (importing transformers is most of a skip's seconds):
    # the last evaluation recorded the same inputs with its prompts' source in place of their ids.
    inputs = {**evaluate_inputs(run, folders, prompt_source(run, prompts), backend), "chosen": chosen.name}
    benchmark_sets = chosen_sets(run, sets, exact_sets)
    if benchmark_sets:  # only then: a run without sets keeps the inputs (and the skip) it had
        inputs["sets"] = set_digests(benchmark_sets)
        if settings.set_prompts is not None:  # only then: the inputs (and the skip) of runs without it stay
            inputs["set_prompts"] = settings.set_prompts
    quick_hash = config_hash(inputs)
    recorded = manifest.record("evaluate") or {}
    if not again and recorded.get("status") == "done" and recorded.get("quick_hash") == quick_hash \
            and report_path.is_file():
        return _skipped(report_path)
    token_ids = heldout_token_ids(run, prompts)
    inputs["prompts"] = config_hash(token_ids)  # the same inputs, the prompts by their ids
    inputs_hash = config_hash(inputs)
    if not again and manifest.is_current("evaluate", inputs_hash) and report_path.is_file():
        manifest.steps["evaluate"]["quick_hash"] = quick_hash  # the next re-run decides quickly
        manifest.save()
        return _skipped(report_path)
    from specops.pipeline.parity import before_evaluation

    parity = [before_evaluation(run, folder, effective) for folder in dict.fromkeys([chosen, *folders])]
    history = manifest.document.get("evaluations") or []
    previous = history[-1] if history else None
    with manifest.recorded("evaluate", inputs_hash, inputs) as outcome:
        untrained_folder = untrained_draft(chosen, run.model_path, run.paths.evaluation / UNTRAINED)
        scorer = Scorer(run, backend, token_ids)
        scorer.baseline_server = effective.baseline_server
        scorer.sets = benchmark_sets if backend == "vllm" else {}
        scorer.set_limit = prompts if prompts is not None else settings.set_prompts
        scorer.total = len(folders) + 1
        say(f"{len(token_ids)} held-out prompts, {scorer.k} speculative tokens, {scorer.max_tokens} tokens each, "
            f"backend {backend}")
        epochs = []
        trained = None
        for folder in folders:
            scored = scorer.score(folder, folder.name)
            say(summary_line(f"epoch {folder.name}", scored))
            epochs.append(scored)
            if folder == chosen:
                trained = scored
        if trained is None:  # best is not among the finished epochs listed (cannot happen; be safe)
            trained = scorer.score(chosen, chosen.name)
        untrained_key = config_hash({"draft": _digest(untrained_folder), "prompts": inputs["prompts"], "k": scorer.k,
                                     "max_tokens": scorer.max_tokens, "backend": backend,
                                     "by": settings.untrained if backend == "vllm" else None,
                                     "versions": package_versions(),
                                     "serve": ([list(run.config.vllm.serve_args),
                                                scorer.servers[-1].get("vllm_version")]
                                               if backend == "vllm" and scorer.servers else None)})
        known = None if again else (manifest.document.get(UNTRAINED_SCORES) or {}).get(untrained_key)
        if known is not None:  # the same untrained draft on the same prompts: greedy, so the same counts
            untrained = {**known, "reused": True}
            say(summary_line("untrained (scored before, same draft and prompts)", untrained))
        else:  # with vllm, by the replay unless asked: a server load of its own for a floor is not worth it
            by = "hf" if backend == "vllm" and settings.untrained == "replay" and replay_drafts(kind) else backend
            untrained = scorer.score(untrained_folder, UNTRAINED, by)
            if by != backend:
                untrained["scored_by"] = "the hf replay (evaluate.untrained: replay; no server load of its own)"
            say(summary_line("untrained" + (" (the hf replay)" if by != backend else ""), untrained))
        untrained_by = "hf" if backend == "vllm" and settings.untrained == "replay" and replay_drafts(kind) else backend
        set_results = {}
        if benchmark_sets:
            from specops.pipeline.evaluation.benchmarks import score_sets

            set_results = score_sets(run, scorer, chosen, untrained_folder, benchmark_sets,
                                     prompts if prompts is not None else settings.set_prompts, untrained_by, say)
        plot = plot_acceptance(trained, untrained, epochs if all_epochs else [], run.paths.checkpoints / PLOT_FILE,
                               title=f"{run.paths.name}: {len(token_ids)} held-out prompts, k={scorer.k}")
        document = {"report": trained, "untrained": untrained, "previous": previous,
                    "epochs": epochs if all_epochs else [], "plot": str(plot), "checkpoint_path": str(chosen),
                    "best": best, "parity": [{key: item[key] for key in ("draft", "ok", "vllm")} for item in parity],
                    "servers": [{key: s.get(key) for key in ("job", "reused", "port", "vllm_version", "ready_s")}
                                for s in scorer.servers]}
        if set_results or settings.compare:
            document["sets"] = set_results
            document["compare"] = {label: dict(figures) for label, figures in settings.compare.items()}
        document["record"] = str(write_record(run, chosen, backend, prompts, scorer, inputs, document,
                                              benchmark_sets, checkpoint or settings.checkpoint,
                                              serve_python=effective.serve_python))
        atomic.write_json(report_path, document)
        _progress(run, state="done", prompts=len(token_ids), backend=backend)
        manifest.steps["evaluate"]["quick_hash"] = quick_hash  # kept by the finish: it updates this record
        if known is None:
            scores = {**(manifest.document.get(UNTRAINED_SCORES) or {}), untrained_key: untrained}
            manifest.document[UNTRAINED_SCORES] = dict(list(scores.items())[-UNTRAINED_KEPT:])
        entry = {key: trained[key] for key in ("mean_acceptance_length", "acceptance_rate", "per_position_acceptance",
                                               "num_drafts", "num_draft_tokens", "num_accepted_tokens", "prompts",
                                               "checkpoint", "backend")}
        entry.update(untrained_mean_acceptance_length=untrained["mean_acceptance_length"], at=time.time(),
                     train=inputs["train"])
        manifest.document["evaluations"] = [*history, entry][-HISTORY:]
        outcome.counts = EvaluateCounts(mean_acceptance_length=trained["mean_acceptance_length"],
                                        untrained=untrained["mean_acceptance_length"], prompts=len(token_ids),
                                        backend=backend)
    return {**document, "step": "evaluate", "status": "done", "inputs_hash": inputs_hash}


def write_record(run: Run, chosen: Path, backend: str, limit: int | None, scorer: Scorer, inputs: dict[str, Any],
                 document: dict[str, Any], sets: dict[str, Path], which: str, *,
                 serve_python: str | None = None) -> Path:
    """The provenance record beside the figures (evaluation/record.json): what --reproduce evaluates from."""
    from specops.pipeline.data import heldout
    from specops.pipeline.evaluation.provenance import RECORD_FILE, record
    from specops.pipeline.evaluation.replay import ANSWER_BATCH
    from specops.pipeline.run import file_digest

    settings: dict[str, Any] = {"backend": backend, "checkpoint": which, "prompts": limit,
                                "num_speculative_tokens": scorer.k, "max_tokens": scorer.max_tokens,
                                "dtype": run.config.dtype,
                                "untrained": run.config.evaluate.untrained if backend == "vllm" else None}
    if scorer.target is not None:  # the hf replay scored something (every draft, or vllm's untrained floor)
        parameter = next(scorer.target.parameters())
        settings["replay"] = {"device": str(parameter.device), "target_dtype": str(parameter.dtype),
                              "answer_batch": ANSWER_BATCH, "draft_attention": "sdpa", "decoding": "greedy"}
    if scorer.servers:
        import shlex

        # the job record keeps the server's argv (no "command" key): the exact command, as a shell would run it
        # once per job: the held-out prompts and every set may be served by one reused server
        used = {server.get("job"): server for server in scorer.servers}.values()
        argvs = [(getattr(server.get("server"), "record", None) or {}).get("argv") for server in used]
        settings["servers"] = [{"command": shlex.join(argv) if argv else None,
                                "job": server.get("job"), "vllm_version": server.get("vllm_version")}
                               for server, argv in zip(used, argvs, strict=True)]
    prompts_file = run.paths.heldout / heldout.PROMPTS_FILE
    prompt_sets: dict[str, Any] = {"heldout": {"file": str(prompts_file), "token_ids": inputs["prompts"],
                                               "digest": file_digest(prompts_file) if prompts_file.is_file() else None}}
    prompt_sets.update({name: {"file": str(path), "digest": file_digest(path)} for name, path in sets.items()})
    figures = {"heldout": {"trained": document["report"]["mean_acceptance_length"],
                           "untrained": document["untrained"]["mean_acceptance_length"]}}
    for name, result in (document.get("sets") or {}).items():
        figures[name] = {"trained": result["trained"]["mean_acceptance_length"],
                         "untrained": result["untrained"]["mean_acceptance_length"]}
    path = run.paths.evaluation / RECORD_FILE
    atomic.write_json(path, record(run, checkpoint=chosen, checkpoint_digest=_digest(chosen), settings=settings,
                                   prompt_sets=prompt_sets, figures=figures,
                                   serve_version=scorer.servers[-1].get("vllm_version") if scorer.servers else None,
                                   serve_python=serve_python))
    return path


def _checkpoint_by_digest(run: Run, digest: str, record_file: Path) -> Path:
    from specops.pipeline.evaluation.drafts import epoch_folders

    for folder in epoch_folders(run.paths.checkpoints):
        if _digest(folder) == digest:
            return folder
    raise BadInput(f"--reproduce: {record_file}: key 'checkpoint.digest' {digest}: no finished checkpoint of run "
                   f"{run.paths.name} has these weights")


def recorded_backend(record_file: str | Path) -> Any:
    """The evaluate backend a provenance record names: --reproduce enters the engine with it as --backend."""
    from specops.pipeline.evaluation.provenance import read_record

    return read_record(Path(record_file))["settings"].get("backend")


def reproduce(run: Run, run_settings: EffectiveSettings, record_file: str | Path) -> dict[str, Any]:
    """Evaluate again from a provenance record: its checkpoint (found by digest), settings and prompt sets;
    the figures against the recorded ones, and every difference of versions, hardware and settings.
    `run_settings`: made at the engine's entry with the record's backend (recorded_backend)."""
    from specops.pipeline.evaluation.provenance import RECORD_FILE, differences, figure_changes, read_record

    path = Path(record_file)
    old = read_record(path)
    settings = old["settings"]
    folder = _checkpoint_by_digest(run, old["checkpoint"]["digest"], path)
    sets = {}
    for name, entry in old["prompt_sets"].items():
        if name == "heldout":
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
            raise BadInput(f"--reproduce: {path}: key 'prompt_sets.{name}.file': missing")
        sets[name] = entry["file"]
    try:  # the record's k and answer length, whatever the run config says now
        run.config.evaluate = run.config.evaluate.model_copy(update={
            "num_speculative_tokens": int(settings["num_speculative_tokens"]),
            "max_tokens": int(settings["max_tokens"])})
    except (KeyError, TypeError, ValueError):
        raise BadInput(f"--reproduce: {path}: key 'settings.num_speculative_tokens'/'settings.max_tokens': "
                       "missing or not a number") from None
    say(f"reproducing {path}: checkpoint {folder.name} (digest {old['checkpoint']['digest']}), "
        f"backend {settings.get('backend')}, sets {', '.join(sets) or 'none'}")
    evaluate(run, run_settings, checkpoint=folder.name, prompts=settings.get("prompts"), sets=sets,
             exact_sets=True, again=True, notes=True)
    new_path = run.paths.evaluation / RECORD_FILE
    new = json.loads(new_path.read_text())
    changes = figure_changes(old, new)
    differs = differences(old, new)
    if changes:
        say("the figures differ: " + "; ".join(changes))
        say("what differs: " + ("; ".join(differs) or "nothing recorded (a kernel that is not deterministic?)"))
    else:
        say("the same figures" + (f"; recorded differences: {'; '.join(differs)}" if differs else ""))
    return {"step": "evaluate", "status": "reproduced" if not changes else "figures differ",
            "reproduced": not changes, "record": str(path), "new_record": str(new_path),
            "figures": new["figures"], "recorded_figures": old["figures"], "figure_changes": changes,
            "differences": differs}


def _skipped(report_path: Path) -> StepReport:
    import json

    return {**json.loads(report_path.read_text()), "step": "evaluate", "status": "skipped: unchanged"}


def pipeline_step(context: StepContext) -> StepReport:
    """The pipeline's evaluate: the run's checkpoint with the run's evaluate backend (its settings')."""
    report = evaluate(context.run, context.settings)
    # the per-set figures too: `invoke pipeline --json` is where a user reads them (and the record that says
    # what made them), not only evaluation/report.json on the host
    shown = {key: report.get(key) for key in ("report", "untrained", "previous", "plot", "best", "sets", "compare",
                                              "record")}
    return {**report, "figures": {"evaluation": shown}}
