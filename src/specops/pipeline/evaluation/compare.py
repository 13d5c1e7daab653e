"""`evaluate --compare none,ngram,suffix,eagle3`: which speculator serves this target best, side by side.

compare(run, settings, ["none", "ngram", "suffix", "eagle3"], concurrency=[1, 8]) puts each kind on the same
prompts (the run's held-out prompts and its benchmark sets) under the same server settings, and writes
<run>/evaluation/compare.json and compare.png beside the evaluation report: for each kind its acceptance per set
(mean acceptance length, per position: vLLM's own `vllm:spec_decode_*` counters, as evaluate reads them), its
output tokens/s at each concurrency on the held-out prompts, the speedup against `none` (the target alone) at
the same concurrency, and the best kind at each concurrency with its margin over the next.

Kinds (specops.contract.values.SPECULATOR_KINDS): `none`, vLLM's training-free `ngram` (prompt lookup) and
`suffix` (suffix decoding), and the trained kinds (eagle3, dflash, ...): the run's own draft (its draft.method,
its evaluate.checkpoint), or `KIND@RUN`, another run's draft for the same target. A trained kind's
--speculative-config comes from one builder for every kind (`trained_config`).

vllm: vLLM's speculative config is fixed per server, so one server per kind (the run's `vllm-server` job,
replaced kind by kind; `none` reuses a target-alone server that is up), its flags the same for every kind but
--speculative-config. Every kind gets one warm-up request outside its counts and timings, then the held-out
prompts `rounds` times at each concurrency (its tokens/s the median round). What a kind needs
that the serve env lacks (suffix: arctic_inference) is found before any load, read from vLLM's source by the
doctor (specops.doctor.training_free_support): that row says why, with no number. hf: the replay drafts as
EAGLE-3 does; a kind it cannot draft like (the training-free ones, the other trained kinds) and every speed
column read "vLLM only".

How honest the speed is: the kinds are measured one after another on one host, so what else runs there in
between moves them; bench/serving_compare.py prints the table on a finished run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput, as_bad_input
from specops.contract.progress import speaker
from specops.contract.values import NO_SPECULATION, TRAINED_KINDS, TRAINING_FREE
from specops.host import atomic
from specops.pipeline.evaluation.kinds import replay_drafts, vllm_only

if TYPE_CHECKING:
    from specops.pipeline.run import EffectiveSettings, Run

COMPARE_FILE = "compare.json"
COMPARE_PLOT = "compare.png"
HELDOUT = "heldout"  # the held-out prompts' row among the sets
DEFAULT_CONCURRENCY = [1, 8]
# the held-out prompts are sent this many times at each concurrency and the median tokens/s kept: on a CPU a round
# of the tiny run takes about a second, and one round's rate moved by half between two runs of the same command
DEFAULT_ROUNDS = 3
# vLLM's n-gram prompt lookup: the longest match of 4 tokens down to 2 in the context proposes the tokens that
# followed it (vLLM's docs give prompt_lookup_max 4; the minimum lets shorter contexts draft at all)
NGRAM_LOOKUP = {"prompt_lookup_max": 4, "prompt_lookup_min": 2}
# vLLM's suffix decoding keeps a global tree of every answer it served and drafts from it for later requests; the
# comparison sends the same prompts again (the warm-up, each round, each concurrency), so with that tree a later round
# drafts the server's own earlier answer word for word (measured on the real target: 17 -> 51 tokens/s between two
# rounds at concurrency 1, acceptance 1.49 -> 3.63 at 8): the prompt's own tree only, as n-gram's prompt lookup
SUFFIX_SETTINGS = {"suffix_decoding_max_cached_requests": 0}
WARMUP_TOKENS = 4
VLLM_ONLY = "vLLM only"


say = speaker("evaluate")


def parse_compare(text: str) -> list[str]:
    """`none,ngram,suffix,eagle3` -> the labels, each a known kind once (bad input: one line)."""
    from specops.contract.values import speculator_list

    return as_bad_input(speculator_list, text)


@dataclass
class Entry:
    """One kind of the comparison, as decided before any load."""

    label: str  # as asked: none, ngram, eagle3, dflash@RUN
    kind: str
    config: dict[str, Any] | None = None  # the server's --speculative-config; None: the target alone
    draft: Path | None = None  # a trained kind's checkpoint folder
    run_name: str | None = None  # a trained kind's run
    unavailable: str | None = None  # why it has no number (not servable here, or vLLM only): one line
    result: dict[str, Any] = field(default_factory=dict)
    owner: Any = None  # a trained kind's Run (not in the document)

    def row(self) -> dict[str, Any]:
        return {"label": self.label, "kind": self.kind, "speculative_config": self.config,
                "draft": str(self.draft) if self.draft else None, "run": self.run_name,
                "unavailable": self.unavailable, **self.result}


def trained_config(draft: Path, tokens: int) -> dict[str, Any]:
    """The --speculative-config of a trained draft of any kind: the one builder every kind plugs into
    (specops.pipeline.vllm.serving_config, the kind read from the draft's own config.json: k tokens a step for the
    kinds that draft token by token, the block's own for the block kinds; /work/notes/compare-interface.md)."""
    from specops.pipeline.vllm import serving_config

    return serving_config(draft, tokens)


def training_free_config(kind: str, tokens: int) -> dict[str, Any]:
    """ngram: prompt lookup (NGRAM_LOOKUP); suffix: suffix decoding, `tokens` its most per step (it speculates a
    number of its own each step, up to that), from the prompt's own tree (SUFFIX_SETTINGS: the comparison repeats
    its prompts); both at the trained kinds' k, the same budget."""
    if kind == "ngram":
        return {"method": "ngram", "num_speculative_tokens": tokens, **NGRAM_LOOKUP}
    if kind == "suffix":
        return {"method": "suffix", "num_speculative_tokens": tokens, **SUFFIX_SETTINGS}
    return {"method": kind, "num_speculative_tokens": tokens}


def unmeasurable(kind: str, settings: frozenset[str]) -> str | None:
    """Why a training-free kind cannot be compared fairly on this vLLM (None: it can): suffix decoding without the
    setting that turns its global tree of past answers off would draft the repeated prompts from its own earlier
    answers. `settings`: the serve env's SpeculativeConfig fields, as the doctor reads them (empty: not read)."""
    missing = sorted(set(SUFFIX_SETTINGS) - settings) if kind == "suffix" and settings else []
    if missing:
        return (f"not comparable here: this vLLM's SpeculativeConfig has no {', '.join(missing)}, so suffix "
                "decoding would draft the comparison's repeated prompts from its own earlier answers")
    return None


def _run_method(run: Run) -> str:
    return run.config.draft.method


def _draft_run(run: Run, label: str, kind: str, name: str | None) -> Run:
    """The run whose draft `label` names: this one, or KIND@RUN's (the same target, that kind's draft)."""
    from specops.pipeline.run import Run as RunClass
    from specops.pipeline.run import model_digest

    if name is None or name == run.paths.name:
        if _run_method(run) != kind:
            raise BadInput(f"--compare {label}: run {run.paths.name} trains {_run_method(run)} drafts (draft.method); "
                           f"name the run of a {kind} draft: {kind}@RUN")
        return run
    other = RunClass(name, run.paths.workdir)
    if _run_method(other) != kind:
        raise BadInput(f"--compare {label}: run {name} trains {_run_method(other)} drafts (draft.method), not {kind}")
    if model_digest(other.model_path) != model_digest(run.model_path):
        raise BadInput(f"--compare {label}: run {name}'s target ({other.model_path}) is not run {run.paths.name}'s "
                       f"({run.model_path}): a comparison is of one target")
    return other


def plan(run: Run, effective: EffectiveSettings, labels: list[str], checkpoint: str | None,
         backend: str) -> list[Entry]:
    """Every kind's server config, or why it has none, before any load."""
    from specops.pipeline.evaluation.step import chosen_checkpoint

    k = run.config.evaluate.num_speculative_tokens
    support = _training_free_support(effective) if backend == "vllm" and any(
        label in TRAINING_FREE for label in labels) else {}
    entries = []
    for label in labels:
        kind, _, name = label.partition("@")
        entry = Entry(label, kind)
        if kind == NO_SPECULATION:
            entry.unavailable = None if backend == "vllm" else VLLM_ONLY
        elif kind in TRAINING_FREE:
            entry.config = training_free_config(kind, k)
            found = support.get(kind)
            if backend != "vllm":
                entry.unavailable = f"{VLLM_ONLY}: a training-free speculator has no hf replay"
            elif found is not None and found.servable is False:
                entry.unavailable = f"not servable here: {found.why}" + (f" ({found.fix})" if found.fix else "")
            elif found is not None:
                entry.unavailable = unmeasurable(kind, found.settings)
        elif kind in TRAINED_KINDS:
            owner = entry.owner = _draft_run(run, label, kind, name or None)
            entry.run_name = owner.paths.name
            entry.draft, _ = chosen_checkpoint(owner, checkpoint or owner.config.evaluate.checkpoint)
            if backend != "vllm":
                entry.unavailable = None if replay_drafts(kind) else vllm_only(kind)
            elif effective.draft_unservable:
                entry.unavailable = f"not servable here: {effective.draft_unservable}"
            else:
                try:
                    entry.config = trained_config(entry.draft, k)
                except BadInput as exc:
                    entry.unavailable = f"not servable here: {exc}"
        entries.append(entry)
    return entries


def _training_free_support(effective: EffectiveSettings) -> dict[str, Any]:
    from specops.doctor import training_free_support
    from specops.pipeline.vllm import serve_env

    path = effective.vllm_path
    if path is None:
        from specops.doctor import interpreter_path

        python, _ = serve_env(effective.serve_python)
        path = interpreter_path(str(python))
    return training_free_support(path) if path else {}


def compare(run: Run, effective: EffectiveSettings, labels: list[str], concurrency: list[int] | None = None,
            checkpoint: str | None = None, prompts: int | None = None, sets: dict[str, str] | None = None,
            rounds: int | None = None) -> dict[str, Any]:
    """The comparison's document (written to <run>/evaluation/compare.json, its plot beside it)."""
    from specops.pipeline.data import load_tokenizer
    from specops.pipeline.evaluation.benchmarks import chosen_sets
    from specops.pipeline.evaluation.prompts import heldout_token_ids
    from specops.pipeline.evaluation.sets import read_set

    for note in effective.notes:
        say(note)
    backend = effective.evaluate_backend
    if backend == "hf" and concurrency not in (None, [1]):
        raise BadInput("--concurrency: the hf backend replays the drafting and measures acceptance only "
                       "(no requests in flight); use --backend vllm for tokens/s at several concurrencies")
    concurrency = concurrency or (DEFAULT_CONCURRENCY if backend == "vllm" else [1])
    rounds = rounds or DEFAULT_ROUNDS
    entries = plan(run, effective, labels, checkpoint, backend)
    set_files = chosen_sets(run, sets)
    # the sets' first --prompts conversations, else the run's evaluate.set_prompts, as evaluate reads them
    per_set = prompts if prompts is not None else run.config.evaluate.set_prompts
    conversations = {name: read_set(name, path, per_set) for name, path in set_files.items()}
    token_ids = heldout_token_ids(run, prompts)
    k, max_tokens = run.config.evaluate.num_speculative_tokens, run.config.evaluate.max_tokens
    for entry in entries:
        if entry.unavailable:
            say(f"{entry.label}: {entry.unavailable}")
    from specops.pipeline.parity import before_evaluation

    for entry in entries:  # as before every evaluation of a trained draft: one line and exit 1 on a mismatch
        if entry.draft is not None and entry.unavailable is None:
            before_evaluation(entry.owner, entry.draft, effective)
    say(f"comparing {', '.join(labels)}: {len(token_ids)} held-out prompts"
        + (f" and sets {', '.join(conversations)}" if conversations else "")
        + f", {max_tokens} tokens each, k={k}, backend {backend}"
        + (f", concurrency {concurrency}, {rounds} rounds each" if backend == "vllm" else ""))
    started = time.time()
    tokenizer = load_tokenizer(run) if conversations else None
    servers: list[dict[str, Any]] = []
    for entry in entries:
        if entry.unavailable:
            continue
        if backend == "vllm":
            entry.result = _served_kind(run, entry, token_ids, conversations, tokenizer, concurrency, max_tokens,
                                        rounds, servers)
        else:
            entry.result = _replayed_kind(run, entry, token_ids, conversations, tokenizer, k, max_tokens)
    rows = [entry.row() for entry in entries]
    _speedups(rows, concurrency)
    document = {"backend": backend, "kinds": labels, "prompts": len(token_ids),
                "sets": {name: {"file": str(path), "conversations": len(conversations[name])}
                         for name, path in set_files.items()},
                "max_tokens": max_tokens, "num_speculative_tokens": k, "concurrency": concurrency,
                "rounds": rounds if backend == "vllm" else None,
                "rows": rows, "best": best_kinds(rows, concurrency), "started_at": started,
                "seconds": round(time.time() - started, 2),
                "servers": [{key: s.get(key) for key in ("label", "job", "reused", "port", "vllm_version", "ready_s",
                                                         "command")} for s in servers]}
    if NO_SPECULATION not in labels and backend == "vllm":
        document["speedup_note"] = "not measured: `none` (the target alone) is not among the kinds compared"
    for line in table_lines(document):
        say(line)
    from specops.pipeline.evaluation.plot import plot_compare

    document["plot"] = str(plot_compare(document, run.paths.evaluation / COMPARE_PLOT,
                                        title=f"{run.paths.name}: {len(token_ids)} held-out prompts, k={k} "
                                              f"({backend})"))
    atomic.write_json(run.paths.evaluation / COMPARE_FILE, document)
    return document


def _served_kind(run: Run, entry: Entry, token_ids: list[list[int]], conversations: dict[str, list[list[str]]],
                 tokenizer: Any, concurrency: list[int], max_tokens: int, rounds: int,
                 servers: list[dict[str, Any]]) -> dict[str, Any]:
    """One server with this kind's speculative config: a warm-up request, the held-out prompts `rounds` times at
    each concurrency (tokens/s: the median round; the counts: the first), then every set's turns at the highest
    concurrency."""
    import shlex
    import statistics

    from specops.pipeline.evaluation.benchmarks import served_turns
    from specops.pipeline.evaluation.report import figures
    from specops.pipeline.evaluation.served import complete, run_prompts
    from specops.pipeline.vllm import generating_server

    server = generating_server(run, speculative=entry.config)
    argv = (getattr(server.get("server"), "record", None) or {}).get("argv")
    servers.append({**server, "label": entry.label, "command": shlex.join(argv) if argv else None})
    speculative = entry.config is not None
    positions = int(entry.config["num_speculative_tokens"]) if speculative else 0
    complete(server["endpoint"], server["model"], token_ids[0], WARMUP_TOKENS)  # outside every count and timing
    cells: dict[int, dict[str, Any]] = {c: {"concurrency": c, "rounds": []} for c in concurrency}
    acceptance: dict[str, Any] = {}
    # rounds outermost: a change in the machine's load while this server is up falls on every concurrency alike
    for round_ in range(rounds):
        for c in concurrency:
            result = run_prompts(server["endpoint"], server["model"], token_ids, max_tokens, positions,
                                 speculative=speculative, concurrency=c)
            cell = cells[c]
            cell["rounds"].append(result["tokens_per_s"])
            if round_ == 0:  # greedy: every round drafts the same; the first one's counts stand for them
                cell.update(generated_tokens=result["generated_tokens"], seconds=result["seconds"])
                if speculative:
                    counted = figures(result["counters"], len(token_ids), entry.label, "vllm")
                    cell["mean_acceptance_length"] = counted["mean_acceptance_length"]
                    acceptance.setdefault(HELDOUT, {**counted, "concurrency": c, "counts_from": "metrics_deltas"})
            say(f"{entry.label}, concurrency {c}, round {round_ + 1} of {rounds}: {result['tokens_per_s']} tokens/s"
                + (f", mean acceptance length {cell['mean_acceptance_length']:.3f}" if speculative else ""))
    speed = []
    for cell in cells.values():  # the median round: one burst on a shared machine does not decide the row
        rates = [rate for rate in cell["rounds"] if rate is not None]
        speed.append({**cell, "tokens_per_s": round(statistics.median(rates), 2) if rates else None})
    set_speed: dict[str, Any] = {}
    for name, turns in conversations.items():  # every kind, `none` too: each set's speedup is on its own turns
        counts, pairs, spent = served_turns(server, tokenizer, turns, positions, max_tokens,
                                            concurrency=max(concurrency), speculative=speculative)
        rate = round(spent["tokens"] / spent["seconds"], 2) if spent["seconds"] else None
        set_speed[name] = {"concurrency": max(concurrency), "tokens_per_s": rate, "prompts": len(pairs),
                           "generated_tokens": spent["tokens"]}
        if speculative:
            acceptance[name] = {**figures(counts, len(pairs), entry.label, "vllm"), "concurrency": max(concurrency),
                                "tokens_per_s": rate}
            say(f"{entry.label}, set {name}: mean acceptance length "
                f"{acceptance[name]['mean_acceptance_length']:.3f} on {len(pairs)} prompts, {rate} tokens/s")
        else:
            say(f"{entry.label}, set {name}: {rate} tokens/s on {len(pairs)} prompts")
    return {"speed": speed, "acceptance": acceptance, "set_speed": set_speed, "job": server.get("job")}


def _replayed_kind(run: Run, entry: Entry, token_ids: list[list[int]], conversations: dict[str, list[list[str]]],
                   tokenizer: Any, k: int, max_tokens: int) -> dict[str, Any]:
    """The hf replay of a trained draft's greedy drafting: its acceptance per set, no speed."""
    from specops.pipeline.evaluation.benchmarks import _hf_answer
    from specops.pipeline.evaluation.sets import walk_turns
    from specops.pipeline.evaluation.step import Scorer

    assert entry.draft is not None
    scorer = Scorer(run, "hf", token_ids)
    acceptance = {HELDOUT: scorer.score(entry.draft, entry.label)}
    for name, turns in conversations.items():
        pairs = walk_turns(tokenizer, turns, _hf_answer(run, scorer, tokenizer))
        shared = Scorer(run, "hf", [prompt for prompt, _ in pairs])
        shared.target = scorer.target
        shared.answers = {index: answer for index, (_, answer) in enumerate(pairs)}
        acceptance[name] = shared.score(entry.draft, entry.label)
    return {"speed": [], "acceptance": acceptance}


def _speedups(rows: list[dict[str, Any]], concurrency: list[int]) -> None:
    """Each served kind's tokens/s over `none`'s at the same concurrency (None where `none` was not measured), on
    the held-out prompts and on each set's own turns."""
    base = next((row for row in rows if row["kind"] == NO_SPECULATION and row.get("speed")), None)
    base_rate = {cell["concurrency"]: cell["tokens_per_s"] for cell in base["speed"]} if base else {}
    base_sets = {name: cell.get("tokens_per_s") for name, cell in ((base or {}).get("set_speed") or {}).items()}
    for row in rows:
        for cell in row.get("speed") or []:
            rate, against = cell.get("tokens_per_s"), base_rate.get(cell["concurrency"])
            cell["speedup"] = round(rate / against, 3) if rate and against else None
        for name, cell in (row.get("set_speed") or {}).items():
            rate, against = cell.get("tokens_per_s"), base_sets.get(name)
            cell["speedup"] = round(rate / against, 3) if rate and against else None


def best_kinds(rows: list[dict[str, Any]], concurrency: list[int]) -> list[dict[str, Any]]:
    """At each concurrency the kind with the most output tokens/s, its speedup, and its margin over the next."""
    best = []
    for c in concurrency:
        measured = sorted(((cell["tokens_per_s"], row["label"], cell.get("speedup")) for row in rows
                           for cell in row.get("speed") or [] if cell["concurrency"] == c and cell.get("tokens_per_s")),
                          reverse=True)
        if not measured:
            continue
        rate, label, speedup = measured[0]
        entry: dict[str, Any] = {"concurrency": c, "label": label, "tokens_per_s": rate, "speedup": speedup}
        if len(measured) > 1:
            entry.update(runner_up=measured[1][1], margin=round(rate / measured[1][0] - 1, 4))
        best.append(entry)
    return best


def _number(value: Any, form: str = "{:.2f}") -> str:
    return "-" if value is None else form.format(value)


def table_lines(document: dict[str, Any]) -> list[str]:
    """The comparison as plain text: one row per kind, then the best at each concurrency."""
    sets = [HELDOUT, *document.get("sets", {})]
    concurrency = document["concurrency"]
    served = document["backend"] == "vllm"
    header = ["kind", *[f"{name} MAL (per position)" for name in sets]]
    set_names = list(document.get("sets", {}))
    if served:
        header += [f"tok/s c={c}" for c in concurrency] + [f"speedup c={c}" for c in concurrency]
        header += [f"{name} tok/s c={max(concurrency)}" for name in set_names]
    rows = [header]
    for row in document["rows"]:
        if row.get("unavailable"):
            rows.append([row["label"], row["unavailable"]])
            continue
        acceptance = row.get("acceptance") or {}
        line = [row["label"]]
        for name in sets:
            figures = acceptance.get(name)
            line.append("-" if not figures or "mean_acceptance_length" not in figures
                        else f"{figures['mean_acceptance_length']:.3f} ("
                        + " / ".join(f"{value:.2f}" for value in figures["per_position_acceptance"]) + ")")
        if served:
            by_c = {cell["concurrency"]: cell for cell in row.get("speed") or []}
            line += [_number((by_c.get(c) or {}).get("tokens_per_s")) for c in concurrency]
            line += [_number((by_c.get(c) or {}).get("speedup"), "{:.2f}x") for c in concurrency]
            for name in set_names:
                cell = (row.get("set_speed") or {}).get(name) or {}
                line.append(_number(cell.get("tokens_per_s"))
                            + ("" if cell.get("speedup") is None else f" ({cell['speedup']:.2f}x)"))
        rows.append(line)
    widths = [max(len(line[i]) for line in rows if len(line) > i and len(line) == len(header))
              for i in range(len(header))]
    lines = []
    for line in rows:
        if len(line) == len(header):
            lines.append("  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip())
        else:  # a kind with no number: its one line
            lines.append(f"{line[0].ljust(widths[0])}  {line[1]}")
    lines += [best_line(entry) for entry in document.get("best") or []]
    if document.get("speedup_note"):
        lines.append(f"speedup {document['speedup_note']}")
    return lines


def best_line(entry: dict[str, Any]) -> str:
    """`best at concurrency 1: eagle3, 41.2 tokens/s (1.31x none), 12.0% ahead of ngram`."""
    text = f"best at concurrency {entry['concurrency']}: {entry['label']}, {entry['tokens_per_s']:.2f} tokens/s"
    if entry.get("speedup") is not None:
        text += f" ({entry['speedup']:.2f}x none)"
    if entry.get("runner_up"):
        text += f", {100 * entry['margin']:.1f}% ahead of {entry['runner_up']}"
    return text
