"""A run's plan on this host, before any model load: what `specops.planning` computes, fed with what
the run, the host and earlier jobs say. `plan_for(run)` makes it; `refuse_unfit(run)` is the launch
boundary's check (`run check`, which every task makes before it launches anything): a run whose
hidden-state mode cannot fit is one line, exit 2.

Tokens come from the cheapest source that is right: the prepared rows when prepare has made the
run's N rows, else an estimate from a sample of the conversations rendered with the run's chat
template (loads the tokenizer, never the model), else the upper bound N x max_seq_len.
"""

from __future__ import annotations

import re
import shutil
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops import planning
from specops.contract.errors import BadInput

if TYPE_CHECKING:
    from specops.pipeline.run import Run

SAMPLE_CONVERSATIONS = 32  # rendered to estimate tokens per row before prepare has run
_FLAG = re.compile(r"^--([a-z0-9-]+)(?:=(.*))?$")


def existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def host_facts(run: Run) -> planning.HostFacts:
    """This host's GPUs (count, the smallest one's memory) and the free disk under the run's folder;
    what the run config's `plan:` names instead wins (a host not at hand, or a test's pretend host)."""
    from specops.host import gpus as gpu_reader

    given = run.config.plan
    reading = gpu_reader.read()
    rows = reading.gpus if reading.found and reading.error is None else []
    count = len(rows) if rows else gpu_reader.device_count()
    totals = [row["memory_total_mib"] for row in rows if row.get("memory_total_mib")]
    memory = min(totals) * 2**20 if totals else None
    # what this run already wrote counts as free: the plan's figures include it (a rerun is not refused
    # for the files its own first pass made)
    free = shutil.disk_usage(existing_ancestor(run.paths.run_dir)).free + _written(run)
    overridden = [key for key in ("gpus", "gpu_memory_gib", "disk_free_gb") if getattr(given, key) is not None]
    if given.gpus is not None:
        count = given.gpus
    if given.gpu_memory_gib is not None:
        memory = int(given.gpu_memory_gib * planning.GIB)
    if given.disk_free_gb is not None:
        free = int(given.disk_free_gb * planning.GB)
    source = "measured" if not overridden else f"{run.label} plan: {', '.join(overridden)}; the rest measured"
    return planning.HostFacts(gpus=count, gpu_memory_bytes=memory if count else None, disk_free_bytes=free,
                              source=source)


def _written(run: Run) -> int:
    total = 0
    for folder in (run.paths.hidden_states, run.paths.checkpoints, run.paths.prepared):
        if folder.is_dir():
            total += sum(path.stat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())
    return total


def rows_asked(run: Run, samples: int | None = None) -> int | None:
    """N: the rows the run trains on (`--samples`, else the run's samples, else every conversation of a
    local file); None when only a hub dataset could say (nothing is downloaded to plan)."""
    if samples or run.config.samples:
        return int(samples or run.config.samples)
    path = run.paths.resolve(run.config.data)
    if not path.is_file():
        return None
    from specops.pipeline.data import Conversation, read_conversations

    count = sum(isinstance(record, Conversation) for record in read_conversations(run.config.data, path))
    return max(count - run.config.evaluate.heldout_prompts, 1)


DataTokens = tuple[int, str, int | None, str]  # tokens, how known; loss tokens (what the draft learns from), how


def counted_tokens(run: Run, rows: int) -> tuple[int, int | None] | None:
    """The tokens and loss tokens of the prepared rows, when prepare has made exactly these N rows."""
    from specops.pipeline.run import Manifest

    record = Manifest(run.paths.run_dir).record("prepare") or {}
    counts = record.get("counts") or {}
    if record.get("status") == "done" and counts.get("rows") == rows and isinstance(counts.get("tokens"), int):
        loss = counts.get("loss_tokens")
        return counts["tokens"], loss if isinstance(loss, int) else None
    return None


def _row_tokens(run: Run, tokenizer: Any, messages: list[dict[str, str]]) -> tuple[int, int]:
    """A row's tokens and loss tokens, cut at max_seq_len: the rendered conversation and its answers; with
    regenerate, the first prompt and an answer of regenerate.max_tokens (the target's answers replace the data's, and
    may run to that length; with max_tokens: max_seq_len, to the row's end)."""
    from specops.pipeline.data import render_ids, tokenise_with_mask

    limit = run.config.max_seq_len
    if not run.config.regenerate.enabled:
        ids, mask = tokenise_with_mask(tokenizer, messages)
        return min(len(ids), limit), sum(mask[:limit])
    first_user = next(index for index, message in enumerate(messages) if message["role"] == "user")
    prompt = len(render_ids(tokenizer, messages[: first_user + 1], generation_prompt=True))
    answer = max(0, min(run.config.regenerate.answer_tokens(limit), limit - prompt))
    return min(prompt + answer, limit), answer


def estimated_tokens(run: Run, rows: int) -> DataTokens | None:
    """Mean tokens (and loss tokens) of the first conversations rendered with the run's template (cut at
    max_seq_len) x N."""
    from specops.pipeline.data import Conversation, load_tokenizer, read_conversations

    if not any((run.model_path / name).is_file() for name in ("tokenizer_config.json", "tokenizer.json")):
        return None  # config files only (a target not downloaded yet): the upper bound, no transformers import
    try:
        path = run.paths.resolve(run.config.data)
        tokenizer = load_tokenizer(run)
        lengths: list[tuple[int, int]] = []
        for record in read_conversations(run.config.data, path):
            if len(lengths) >= SAMPLE_CONVERSATIONS:
                break
            if isinstance(record, Conversation):
                try:
                    lengths.append(_row_tokens(run, tokenizer, record.messages))
                except Exception:  # a conversation the template refuses: prepare skips it too
                    continue
    except Exception:  # no tokenizer or data to sample (remote code, a hub dataset offline): the upper bound
        return None
    if not lengths:
        return None
    mean = statistics.fmean(length for length, _ in lengths)
    loss = statistics.fmean(answer for _, answer in lengths)
    regenerate = run.config.regenerate
    answer = (f"an answer up to the row's max_seq_len {run.config.max_seq_len}" if regenerate.whole_answers
              else f"a {regenerate.max_tokens}-token answer")
    how = (f"estimated: the first {len(lengths)} conversations rendered with the run's chat template"
           + (f" (their first prompt + {answer})" if regenerate.enabled else ""))
    return (round(mean * rows), f"{how}, {mean:.0f} tokens each on average, x {rows} rows",
            round(loss * rows), f"{how}, {loss:.0f} answer tokens each on average, x {rows} rows")


def data_tokens(run: Run, rows: int, *, estimate: bool) -> DataTokens:
    """The rows' tokens and loss tokens (the answers' tokens, what a draft learns from), and how each is known."""
    counted = counted_tokens(run, rows)
    if counted is not None:
        source = f"counted: the {rows} prepared rows"
        return counted[0], source, counted[1], source if counted[1] is not None else "not counted by this prepare"
    if estimate:
        found = estimated_tokens(run, rows)
        if found is not None:
            return found
    bound = f"upper bound: {rows} rows x max_seq_len {run.config.max_seq_len}"
    return rows * run.config.max_seq_len, bound, None, "unknown: no tokenizer or data to sample here"


def _serve_flag(run: Run, name: str) -> str | None:
    args = run.config.vllm.serve_args
    for index, arg in enumerate(args):
        match = _FLAG.match(arg)
        if match and match.group(1) == name:
            return match.group(2) if match.group(2) is not None else (args[index + 1] if index + 1 < len(args)
                                                                       else None)
    return None


def run_facts(run: Run, host: planning.HostFacts, tokens: DataTokens, rows: int) -> planning.RunFacts:
    from specops.pipeline.run import default_backend

    config = run.config
    utilisation = _serve_flag(run, "gpu-memory-utilization")
    kv_dtype = _serve_flag(run, "kv-cache-dtype") or ""
    budget = config.hidden_states.disk_budget_gb
    return planning.RunFacts(
        name=run.paths.name, layer_ids=run.layer_ids(),
        hidden_state_dtype=planning.hidden_state_dtype(config.dtype, host.gpus > 0),
        samples=rows, tokens=tokens[0], tokens_source=tokens[1], loss_tokens=tokens[2], loss_tokens_source=tokens[3],
        max_seq_len=config.max_seq_len,
        epochs=config.train.epochs, mode=config.hidden_states.mode,
        disk_budget_bytes=int(budget * planning.GB) if budget is not None else None,
        placement=config.hidden_states.placement, backend=default_backend(run, host.gpus)[0],
        tensor_parallel=config.vllm.tensor_parallel, data_parallel=config.vllm.data_parallel,
        gpu_memory_utilization=float(utilisation) if utilisation else 0.9,
        kv_dtype_bytes=1 if kv_dtype.startswith("fp8") else None,
        draft_vocab=config.draft.vocab_size, draft_layers=config.draft.layers, ttt_steps=config.draft.ttt_steps,
        tokens_per_step=config.train.total_seq_len or 8192, optimizer=config.train.optimizer or "muon",
        expert_parallel="--enable-expert-parallel" in config.vllm.serve_args,
        hidden_state_backend=config.hidden_states.backend)


def measured_rates(run: Run) -> planning.Rates:
    """Rates the run config gives, else those this run's earlier jobs on this host recorded (the extract
    step's tokens and seconds in the manifest, the trainer's tokens/s in its log), else unknown."""
    from specops.pipeline.run import Manifest

    given = run.config.plan
    record = Manifest(run.paths.run_dir).record("extract") or {}
    written, seconds = (record.get("counts") or {}).get("tokens_written"), record.get("seconds")
    extract = planning.Rate(None, "unknown: no extraction recorded for this run; set plan.extract_tokens_per_s")
    if given.extract_tokens_per_s:
        extract = planning.Rate(given.extract_tokens_per_s, "run config")
    elif written and seconds:
        extract = planning.Rate(round(written / seconds, 1), "measured: this run's last extraction on this host")
    train = planning.Rate(None, "unknown: no training logged for this run; set plan.train_tokens_per_s")
    if given.train_tokens_per_s:
        train = planning.Rate(given.train_tokens_per_s, "run config")
    elif (run.paths.checkpoints / "train.log").is_file():
        from specops.pipeline.training import metrics  # numpy comes with the room: only when there is a log

        speeds = [row["tokens_per_s"] for row in metrics.epoch_table(metrics.read_log(
            run.paths.checkpoints / "train.log")) if row.get("tokens_per_s")]
        if speeds:
            train = planning.Rate(round(statistics.median(speeds), 1),
                                  "measured: this run's training log on this host (median of epochs)")
    serve = (planning.Rate(given.serve_tokens_per_s, "run config") if given.serve_tokens_per_s
             else planning.Rate(extract.tokens_per_s, f"the extraction rate ({extract.source})"))
    return planning.Rates(extract=extract, train=train, serve=serve)


def plan_for(run: Run, *, samples: int | None = None, estimate: bool = True) -> planning.Plan:
    """The run's plan on this host (BadInput when the target's config is not here to read)."""
    config_file = run.model_path / "config.json"
    if not config_file.is_file():
        raise BadInput(f"{run.label}: model: {config_file} not found: the plan reads the target's config (that file "
                       "alone is enough: no weights are read or written)")
    rows = rows_asked(run, samples)
    if rows is None:
        raise BadInput(f"{run.label}: samples: not set, and {run.config.data} is no local file to count "
                       "conversations in: set samples (or pass --samples) to plan")
    target = planning.read_target(run.model_path)
    host = host_facts(run)
    facts = run_facts(run, host, data_tokens(run, rows, estimate=estimate), rows)
    return planning.make_plan(target, facts, host, measured_rates(run))


def run_advice(run: Run, gpus: int) -> list[str]:
    """The run's settings known to waste a training (planning.learning_advice), as lines naming the run config's
    key: what `plan` and the doctor say before a launch."""
    from specops.pipeline.run import read_model_config, text_config

    config_file = run.model_path / "config.json"
    hidden = text_config(read_model_config(run.model_path)).get("hidden_size") if config_file.is_file() else None
    try:
        rows = rows_asked(run)
    except (BadInput, OSError):  # the data is not readable yet: prepare says why
        rows = None
    advice = planning.learning_advice(rows=rows, optimizer=run.config.train.optimizer, gpus=gpus,
                                      hidden=hidden if isinstance(hidden, int) else None,
                                      generated_target=run.config.embedded is not None)
    return [f"{run.label}: {entry.key}: {entry.line}" for entry in advice]


def checked_plan(run: Run) -> planning.Plan | None:
    """The plan the launch boundary judges (None without the target's config, or without a row count short
    of a hub download): with the upper bound of the tokens first (no tokenizer), and only when that does
    not fit with the data sampled."""
    if not (run.model_path / "config.json").is_file() or rows_asked(run) is None:
        return None
    plan = plan_for(run, estimate=False)
    return plan if planning.fits(plan) else plan_for(run, estimate=True)


def refuse_unfit(run: Run) -> dict[str, Any] | None:
    """The launch boundary's check: BadInput (one line, exit 2) when the run's hidden-state mode does not
    fit this host; else a short summary (None when the target is not here to plan from)."""
    plan = checked_plan(run)
    if plan is None:
        return None
    if not planning.fits(plan):
        raise BadInput(f"{run.label}: hidden_states.mode: {plan.run.mode} does not fit this host: {plan.problems[0]}"
                       + (f" (the plan recommends {plan.recommended['mode']})" if plan.recommended.get("mode") else ""))
    return {"mode": plan.run.mode, "fits": True, "recommended": plan.recommended.get("mode")}


def planned_placement(run: Run) -> dict[str, Any] | None:
    """The plan's placement of the server and the trainer for an online or hybrid run (None offline, or
    without the target's config); a mode that does not fit is refused here too (one line, exit 2)."""
    if run.config.hidden_states.mode == "offline":
        return None
    plan = checked_plan(run)
    if plan is None:
        return None
    if not planning.fits(plan):
        refuse_unfit(run)  # raises the launch boundary's own line
    return plan.modes[plan.run.mode]["placement"]


def run_loads(run: Run, gpus: int, backend: str) -> list[planning.Load]:
    """The vLLM loads the run's pipeline makes on this host (at most: a step that finds its outputs skips,
    and a live server that fits is reused). On a CPU host one server captures hidden states and answers regenerate
    and the target-alone baseline; on a GPU host (regenerate.server own) regenerate's own server answers and
    measures the baseline, or with evaluate.baseline_server and no such server the baseline is a load of its own;
    the parity gate's served check and the trained draft's evaluation are one each.
    `backend`: the run's (its effective settings', or the plan's for the host it plans)."""
    from specops.pipeline.run import baseline_server, regenerate_server
    from specops.pipeline.vllm import serves

    config = run.config
    loads: list[planning.Load] = []
    regenerates = config.regenerate.enabled and (config.regenerate.backend or backend) == "vllm"
    serves_evaluate = config.evaluate.enabled and (config.evaluate.backend or backend) == "vllm"
    own = regenerates and regenerate_server(run, gpus)[0] == "own"
    if own:  # the target alone answers, then measures evaluate's baseline before it stops
        loads.append(planning.Load("the target alone", "regenerate (its own server)" + (
            ", evaluate's baseline" if serves_evaluate and config.evaluate.heldout_prompts else "")))
    capturing = [name for name, on in (
        ("regenerate", regenerates and not own),
        ("extract", config.hidden_states.extracts and backend == "vllm"),
        ("train (online)", config.hidden_states.mode != "offline")) if on]
    if capturing:
        loads.append(planning.Load("the target, capturing hidden states", ", ".join(capturing)))
    gate = config.parity.serve if config.parity.serve is not None else (gpus > 0 or backend == "vllm")
    if gate and serves(run, backend):
        loads.append(planning.Load("the target with the untrained draft", "the parity gate's served request"))
    if serves_evaluate:
        if baseline_server(run, gpus)[0] and not (own and config.evaluate.heldout_prompts):
            loads.append(planning.Load("the target alone", "evaluate (the speedup's baseline)"))
        loads.append(planning.Load("the target with the trained draft", "evaluate"))
        if config.evaluate.untrained == "server":
            loads.append(planning.Load("the target with the untrained draft", "evaluate (evaluate.untrained: server)"))
    return loads


def later_needs(run: Run, gpus: int, backend: str) -> list[str]:
    """What needs the run's vLLM port or the GPUs after its first server: the steps of its later loads, and an
    offline training on GPUs (a served target holds most of each GPU's memory). The launch boundary refuses a
    server another run still owns when this is not empty (vllm.check_before_run)."""
    needs = [load.steps for load in run_loads(run, gpus, backend)[1:]]
    if gpus > 0 and run.config.hidden_states.mode == "offline":
        needs.append("training (on the GPUs)")
    return needs


def measured_loads(run: Run) -> list[float]:
    """Seconds to ready of this run's earlier vLLM loads on this host (their job records)."""
    from specops.jobs import records

    return [float(record["meta"]["ready_s"]) for record in records.all_records()
            if record.get("name") == "vllm-server" and record.get("run") == run.paths.name
            and isinstance((record.get("meta") or {}).get("ready_s"), int | float)]


def planned_loads(run: Run, gpus: int, weight_bytes: int, backend: str) -> dict[str, Any]:
    """`plan --json`'s "loads": the loads the run makes with `backend` (the plan's), each with its estimated
    time, and their total."""
    given = run.config.plan
    rate = planning.load_rate(weight_bytes, given_seconds=given.load_seconds, given_gb_per_s=given.load_gb_per_s,
                              measured_seconds=measured_loads(run))
    from specops.pipeline.vllm import live_server

    loads = run_loads(run, gpus, backend)
    return planning.plan_loads(loads, rate, weight_bytes, live_server(run, backend) if loads else None)
