"""Scoring the benchmark sets (evaluation/sets.py) with the evaluation's own scorer: the trained and the
untrained draft on every turn of every conversation, by the hf replay (the target's greedy answers,
computed once and shared by both drafts) or by vLLM serving the trained draft (the server's own
answers carry each conversation to its next turn, its counters give the figures)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specops.pipeline.evaluation.sets import Answer
    from specops.pipeline.run import Acceptance, Run

# the evaluation's Scorer (step.py), handed in: this module never imports the step (no cycle)
Scorer = Any

SETS_FOLDER = "sets"


def chosen_sets(run: Run, given: dict[str, str] | None, exact: bool = False) -> dict[str, Path]:
    """The run's evaluate.sets with the command's --set on top (`exact`: only the given), as paths."""
    from specops.contract.errors import BadInput
    from specops.pipeline.evaluation.sets import resolve_path

    named = dict(given or {}) if exact else {**run.config.evaluate.sets, **(given or {})}
    chosen = {}
    for name, file in named.items():
        try:
            chosen[name] = resolve_path(file, run.paths.workdir)
        except BadInput as exc:  # a set in a package not installed here: the key that names it
            raise BadInput(f"{run.label}: evaluate.sets.{name}: {exc}") from None
    return chosen


def checked_sets(run: Run) -> dict[str, int]:
    """The run's evaluate.sets read as the evaluation will read them, before any step: a set in a package not
    installed here, a file that is not there or a line in no known shape is one line (BadInput) at the run check,
    not after hours of training. {NAME: the conversations the evaluation will score}."""
    from specops.pipeline.evaluation.sets import read_set

    if not run.config.evaluate.enabled:
        return {}
    set_digests(chosen := chosen_sets(run, None))
    return {name: len(read_set(name, path, run.config.evaluate.set_prompts)) for name, path in chosen.items()}


def set_digests(sets: dict[str, Path]) -> dict[str, str]:
    from specops.contract.errors import BadInput
    from specops.pipeline.run import file_digest

    for name, path in sets.items():
        if not path.is_file():
            raise BadInput(f"evaluate.sets.{name}: {path}: no such file")
    return {name: file_digest(path) for name, path in sets.items()}


def _hf_answer(run: Run, scorer: Scorer, tokenizer: Any) -> Answer:
    from specops.pipeline.evaluation.replay import ANSWER_BATCH, greedy_answers
    from specops.pipeline.target import choose_device, load_target

    if scorer.target is None:
        scorer.target = load_target(run, *choose_device(run.config.dtype))
    target = scorer.target
    device = next(target.parameters()).device

    def answer(prompts: list[list[int]]) -> list[list[int]]:
        answers: list[list[int]] = []
        for start in range(0, len(prompts), ANSWER_BATCH):
            answers += greedy_answers(target, prompts[start: start + ANSWER_BATCH], scorer.max_tokens,
                                      tokenizer.eos_token_id, tokenizer.pad_token_id, device)
        return answers

    return answer


def served_turns(server: dict[str, Any], tokenizer: Any, conversations: list[list[str]], k: int, max_tokens: int,
                 concurrency: int = 1, speculative: bool = True,
                 ) -> tuple[dict[str, Any], list[tuple[list[int], list[int]]], dict[str, Any]]:
    """Every turn of every conversation through a server (speculating, or the target alone), its own answers carrying
    each conversation to its next turn: (its counts summed over the turns, the (prompt, answer) pairs,
    {"tokens", "seconds"} spent)."""
    from specops.pipeline.evaluation.served import run_prompts
    from specops.pipeline.evaluation.sets import walk_turns

    totals: dict[str, Any] = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                              "accepted_per_position": [0] * k}
    spent: dict[str, Any] = {"tokens": 0, "seconds": 0.0}

    def answer(prompts: list[list[int]]) -> list[list[int]]:
        result = run_prompts(server["endpoint"], server["model"], prompts, max_tokens, k, speculative=speculative,
                             concurrency=concurrency)
        if speculative:
            counts = result["per_request"] or result["counters"]
            for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
                totals[key] += counts[key]
            totals["accepted_per_position"] = [a + b for a, b in zip(totals["accepted_per_position"],
                                                                     counts["accepted_per_position"], strict=True)]
        spent["tokens"] += result["generated_tokens"]
        spent["seconds"] += result["seconds"]
        return result["outputs"]

    pairs = walk_turns(tokenizer, conversations, answer)
    return totals, pairs, spent


def target_alone_on_sets(run: Run, server: dict[str, Any], sets: dict[str, Path], limit: int | None, k: int,
                         max_tokens: int, how: str) -> dict[str, dict[str, Any]]:
    """The target alone's output tokens/s on each set, every turn as the speculating server is asked them (one
    conversation at a time, its own answers carrying the next turn): each set's speedup is then against the same
    prompts and settings, not against the held-out prompts' rate."""
    from specops.pipeline.data import load_tokenizer
    from specops.pipeline.evaluation.sets import read_set

    tokenizer = load_tokenizer(run)
    rates: dict[str, dict[str, Any]] = {}
    for name, path in sets.items():
        _, pairs, spent = served_turns(server, tokenizer, read_set(name, path, limit), k, max_tokens,
                                       speculative=False)
        rates[name] = {"tokens_per_s": round(spent["tokens"] / spent["seconds"], 2) if spent["seconds"] else None,
                       "how": how, "prompts_of": f"set {name}: its {len(pairs)} turns, the target alone",
                       "tokens": spent["tokens"]}
    return rates


def _served(run: Run, scorer: Scorer, folder: Path, tokenizer: Any, conversations: list[list[str]],
            name: str) -> tuple[Acceptance, list[tuple[list[int], list[int]]]]:
    """The trained draft served by vLLM: every turn through the server, its answers carrying the next."""
    from specops.pipeline.evaluation.report import figures, with_speed
    from specops.pipeline.vllm import generating_server, serving_config

    speculative = serving_config(folder, scorer.k)  # as the draft's kind is served (eagle3: k a step, as always)
    server = generating_server(run, speculative=speculative)
    scorer.servers.append(server)
    totals, pairs, spent = served_turns(server, tokenizer, conversations, speculative["num_speculative_tokens"],
                                        scorer.max_tokens)
    rate = round(spent["tokens"] / spent["seconds"], 2) if spent["seconds"] else None
    # the speedup against the target alone on this set's own turns (measured with the held-out baseline, on the
    # same server); a rate of other prompts would make a set's speedup the ratio of two different workloads
    base = scorer.set_baselines.get(name) or {
        "tokens_per_s": None, "how": "not measured on this set's prompts: no server of its own for the target alone "
                                     "(evaluate.baseline_server; the extraction server measured the held-out prompts "
                                     "only)"}
    report = with_speed(figures(totals, len(pairs), folder.name, "vllm"), rate, base.get("tokens_per_s"))
    return {**report, "generated_tokens": spent["tokens"], "speedup_baseline": base}, pairs


def score_sets(run: Run, scorer: Scorer, trained: Path, untrained: Path, sets: dict[str, Path],
               limit: int | None, untrained_by: str, say: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """{set: {trained, untrained, conversations, prompts, tokens, file, digest, plot}} for every set."""
    from specops.pipeline.data import load_tokenizer
    from specops.pipeline.evaluation.drafts import UNTRAINED
    from specops.pipeline.evaluation.plot import plot_acceptance
    from specops.pipeline.evaluation.report import summary_line
    from specops.pipeline.evaluation.sets import read_set, walk_turns
    from specops.pipeline.run import file_digest

    tokenizer = load_tokenizer(run)
    results: dict[str, dict[str, Any]] = {}
    for name, path in sets.items():
        conversations = read_set(name, path, limit)
        if scorer.backend == "hf":
            pairs = walk_turns(tokenizer, conversations, _hf_answer(run, scorer, tokenizer))
            trained_figures = None
        else:
            trained_figures, pairs = _served(run, scorer, trained, tokenizer, conversations, name)
        shared = type(scorer)(run, scorer.backend, [prompt for prompt, _ in pairs])
        shared.target, shared.servers = scorer.target, scorer.servers
        shared.base_tokens_per_s, shared.baseline = scorer.base_tokens_per_s, scorer.baseline
        shared.set_baselines = scorer.set_baselines
        shared.answers = {index: answer for index, (_, answer) in enumerate(pairs)}  # the target's, both drafts
        if trained_figures is None:
            trained_figures = shared.score(trained, trained.name)
        untrained_figures = shared.score(untrained, UNTRAINED, untrained_by)
        scorer.target = shared.target
        say(summary_line(f"set {name}: trained", trained_figures))
        say(summary_line(f"set {name}: untrained", untrained_figures))
        (run.paths.evaluation / "sets" / name).mkdir(parents=True, exist_ok=True)
        plot = plot_acceptance(trained_figures, untrained_figures, [],
                               run.paths.evaluation / "sets" / name / "acceptance.png",
                               title=f"{run.paths.name}: set {name}, {len(pairs)} prompts, k={scorer.k}")
        results[name] = {"trained": trained_figures, "untrained": untrained_figures,
                         "conversations": len(conversations), "prompts": len(pairs),
                         "tokens": sum(len(answer) for _, answer in pairs),
                         "file": str(path), "digest": file_digest(path), "plot": str(plot)}
    return results
