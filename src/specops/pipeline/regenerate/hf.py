"""Regenerate with transformers (hosts without vLLM, the embedded default), in speculators' format.

Each row of responses.jsonl is what `speculators regenerate-responses` writes for one generation:
{"id": "<conv>_gen<N>", "primary_id", "input_ids" (prompt + completion), "loss_mask" (0 on the
prompt, 1 on the completion), "text", "metadata": {"idx", "finish_reason", "is_tool_call",
"usage", "endpoint", "sampling_params"}}; a conversation that fails (an empty answer) goes to
responses.errors.jsonl as {"id", "metadata": {"idx", "error", "generations_completed", ...}}.

Conversations are answered in fixed batches of `concurrency` rows of source.jsonl (turn by turn,
left-padded, greedy unless the run asks for sampling, seeded per batch). Each finished batch is
written as one chunk file (atomically), so a kill at any point loses at most the batch in
progress, and a rerun recomputes exactly that batch with exactly the same inputs: the rows are the
same, byte for byte, as an uninterrupted run's. The final files are the chunks joined in order.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.host import atomic
from specops.pipeline.data import regenerated
from specops.pipeline.regenerate.progress import PROGRESS_FILE, Answering

if TYPE_CHECKING:
    from specops.pipeline.run import RegenerateSettings, Run

CHUNKS = "chunks"
ENDPOINT = "hf"


def chunk_paths(folder: Path, batch: int) -> tuple[Path, Path]:
    base = folder / CHUNKS / f"batch-{batch:05d}"
    return base.with_suffix(".jsonl"), base.with_suffix(".errors.jsonl")


def sampling_params(settings: RegenerateSettings) -> dict[str, Any]:
    if settings.temperature == 0:
        return {"temperature": 0.0}
    return {"temperature": settings.temperature, "top_p": settings.top_p, "seed": settings.seed}


class Generator:
    def __init__(self, run: Run) -> None:
        import torch

        from specops.pipeline.data import load_tokenizer
        from specops.pipeline.target import choose_device, load_target

        self.torch = torch
        self.settings = run.config.regenerate
        self.device, dtype = choose_device(run.config.dtype)
        self.model = load_target(run, self.device, dtype)
        self.tokenizer = load_tokenizer(run)
        self.eos = self.tokenizer.eos_token_id
        # a prompt this long leaves no answer token within the rows prepare keeps: never asked (one such
        # prompt would otherwise pad its whole batch to its length: ShareGPT holds prompts of 10k+ tokens)
        self.max_seq_len = run.config.max_seq_len
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos

    def render(self, messages: list[dict[str, str]]) -> list[int]:
        from specops.pipeline.data import render_ids

        return render_ids(self.tokenizer, messages, generation_prompt=True)

    def budget(self, prompt: list[int]) -> int:
        """The most tokens this prompt's answer may take: max_tokens, or with whole answers what is left of
        max_seq_len (a row never runs past what prepare keeps)."""
        if self.settings.whole_answers:
            return self.max_seq_len - len(prompt)
        return self.settings.answer_tokens(self.max_seq_len)

    def shortened(self, prefix: list[dict[str, str]]) -> tuple[list[int], int]:
        """The prompt of `prefix` (the conversation so far, ending with a question): with long_prompts shorten,
        whole turns (a question and its answer) dropped from the front, system turns kept, until it leaves room for
        an answer within max_seq_len (the last question is never dropped); (its token ids, questions dropped)."""
        prompt = self.render(prefix)
        if self.settings.long_prompts != "shorten" or len(prompt) < self.max_seq_len:
            return prompt, 0
        system = [turn for turn in prefix if turn["role"] == "system"]
        rest = [turn for turn in prefix if turn["role"] != "system"]
        dropped = 0
        while len(prompt) >= self.max_seq_len and len(rest) > 1:
            cut = next((at for at in range(1, len(rest)) if rest[at]["role"] == "user"), len(rest) - 1)
            rest, dropped = rest[cut:], dropped + 1
            prompt = self.render(system + rest)
        return prompt, dropped

    def complete(self, prompts: list[list[int]], seed: int,
                 on_step: Callable[[int], None] | None = None) -> list[tuple[list[int], str]]:
        """(completion ids, finish reason) per prompt; the end-of-turn token kept, as vLLM returns it; each at most
        its budget (Generator.budget). on_step(tokens generated so far): called at every generation step (progress
        inside a long batch)."""
        from specops.pipeline.target import left_padded, repeatable_attention

        torch = self.torch
        ids, mask = left_padded(prompts, self.pad)
        width = ids.shape[1]
        settings = self.settings
        options: dict[str, Any] = {"do_sample": False}
        if settings.temperature > 0:
            torch.manual_seed(seed)
            options = {"do_sample": True, "temperature": settings.temperature, "top_p": settings.top_p, "top_k": 0}
        if on_step is not None:
            options["stopping_criteria"] = _steps(torch, width, on_step)
        # the same rows answer alike on every run: SDPA's cuDNN backend does not (issue 42)
        with torch.no_grad(), repeatable_attention(self.device):
            budgets = [self.budget(prompt) for prompt in prompts]
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                      max_new_tokens=max(budgets), eos_token_id=self.eos,
                                      pad_token_id=self.pad, **options)
        results = []
        for row, budget in zip(out[:, width:].tolist(), budgets, strict=True):
            row = row[:budget]  # one batch generates to its longest budget; each answer stops at its own
            if self.eos in row:
                results.append((row[: row.index(self.eos) + 1], "stop"))
            else:
                results.append((row, "length"))
        return results

    def batch(self, items: list[tuple[int, dict[str, Any]]], seed: int,
              where: Callable[[str], None] | None = None) -> tuple[list[dict], list[dict]]:
        """Answer one batch of source rows turn by turn; (rows in source order, errors). where(text): how far
        the batch is, at every generation step (`Answering.within`, which shows it at its own pace)."""
        from specops.pipeline.regenerate.source import prompt_turns

        params = sampling_params(self.settings)
        states = []
        for idx, row in items:
            states.append({"idx": idx, "id": row["id"], "turns": prompt_turns(row["messages"]), "next": 0,
                           "prefix": [], "samples": [], "error": None, "done": False})
        turn_round = 0
        while True:
            pending = []
            for state in states:
                if state["done"]:
                    continue
                while state["next"] < len(state["turns"]) and state["turns"][state["next"]]["role"] == "system":
                    state["prefix"].append(state["turns"][state["next"]])
                    state["next"] += 1
                if state["next"] >= len(state["turns"]):
                    state["done"] = True
                    continue
                state["prefix"].append(state["turns"][state["next"]])
                state["next"] += 1
                pending.append(state)
            if not pending:
                break
            prompts = [self.shortened(state["prefix"])[0] for state in pending]
            fits = [len(prompt) < self.max_seq_len for prompt in prompts]
            for state, prompt, fit in zip(pending, prompts, fits, strict=True):
                if fit:
                    continue
                state["done"] = True  # its earlier answers stay; a first turn this long is a failed conversation
                if not state["samples"]:
                    state["error"] = (f"ValueError('prompt of {len(prompt)} tokens leaves no answer within "
                                      f"max_seq_len {self.max_seq_len}')")
            pending = [state for state, fit in zip(pending, fits, strict=True) if fit]
            prompts = [prompt for prompt, fit in zip(prompts, fits, strict=True) if fit]
            if not pending:
                break
            on_step = None
            if where is not None:
                def on_step(tokens: int, turn: int = turn_round + 1, rows: int = len(pending)) -> None:
                    where(f"turn {turn} of {rows} conversations: {tokens} of at most "
                          f"{self.settings.answer_tokens(self.max_seq_len)} tokens")
            completions = self.complete(prompts, seed * 1000 + turn_round, on_step)
            turn_round += 1
            for state, prompt, (completion, reason) in zip(pending, prompts, completions, strict=True):
                # As vLLM's incremental detokenizer: an unfinished UTF-8 sequence at the end is held back
                # (an answer of nothing but such bytes is empty there, and speculators fails it).
                content = self.tokenizer.decode(completion, skip_special_tokens=True).rstrip("\ufffd")
                if not content:
                    state["error"] = f"ValueError('empty assistant generation (sample {len(state['samples'])})')"
                    state["done"] = True
                    continue
                input_ids = prompt + completion
                state["samples"].append({
                    "id": f"{state['id']}_gen{len(state['samples'])}", "primary_id": state["id"],
                    "input_ids": input_ids, "loss_mask": [0] * len(prompt) + [1] * len(completion),
                    "text": self.tokenizer.decode(input_ids, skip_special_tokens=False),
                    "metadata": {"idx": state["idx"], "finish_reason": reason, "is_tool_call": False,
                                 "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(completion),
                                           "total_tokens": len(input_ids)},
                                 "endpoint": ENDPOINT, "sampling_params": params}})
                state["prefix"].append({"role": "assistant", "content": content})
                # speculators' truncation rule: a row past the answer length ends the conversation; shortened
                # prompts ask every turn instead, and whole answers end it only once the row fills max_seq_len
                if self.settings.long_prompts == "drop" and len(input_ids) > (
                        self.max_seq_len - 1 if self.settings.whole_answers else self.settings.max_tokens):
                    state["done"] = True
        rows, errors = [], []
        for state in states:
            if state["error"] is not None:  # like speculators: a failed conversation writes no rows
                errors.append({"id": state["id"], "metadata": {
                    "idx": state["idx"], "error": state["error"],
                    "generations_completed": len(state["samples"]), "endpoint": ENDPOINT}})
            else:
                rows.extend(state["samples"])
        return rows, errors


def _lines(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def regenerate_hf(run: Run, folder: Path, source: list[dict[str, Any]], span: tuple[int, int] | None = None,
                  samples: int | None = None) -> dict[str, Any]:
    """Answer every source row in batches, resuming from the chunks already on disk; join them.

    span: only source rows [start, stop), on whole-batch boundaries (a host's share): those batches
    are the one-host run's, numbered and seeded as there, so their rows are the same bytes.
    samples: only the first batches, until their answers hold that many rows prepare keeps; the
    report's `answered` says how many source rows they cover."""
    size = run.config.regenerate.concurrency
    batches = [list(enumerate(source))[start:start + size] for start in range(0, len(source), size)]
    start, stop = span if span is not None else (0, len(source))
    if any(end % size and end != len(source) for end in (start, stop)):
        raise ValueError(f"rows {start}..{stop} do not fall on batches of {size}")
    numbers = range(-(-start // size), -(-stop // size))  # an empty last share: no batch
    written = {number for number in numbers if chunk_paths(folder, number)[0].is_file()}
    if written:
        print(f"regenerate: {len(written)} of {len(numbers)} batches already written; resuming", file=sys.stderr)
    generator: Generator | None = None
    kept, done = 0, 0
    # the conversations this run answers (with `samples`, at most: it may stop after fewer batches)
    progress = Answering(folder / PROGRESS_FILE, sum(len(batches[number]) for number in numbers
                                                     if number not in written))
    for number in numbers:
        rows_file, errors_file = chunk_paths(folder, number)
        if number in written:
            rows, _broken = regenerated.read_jsonl(rows_file) if samples is not None else ([], 0)
        else:
            if generator is None:
                generator = Generator(run)
                progress.start()  # after the load: the rates and the ETA are the answering's
            label = f"batch {number + 1}/{len(batches)}"
            rows, errors = generator.batch(batches[number], run.config.regenerate.seed + number,
                                           where=lambda text, label=label: progress.within(f"{label}, {text}"))
            atomic.write_text(errors_file, _lines(errors))  # errors first: the rows file marks the batch done
            atomic.write_text(rows_file, _lines(rows))
            done += 1
            print(f"regenerate: batch {number + 1}/{len(batches)} ({done} this run): {len(rows)} answers, "
                  f"{len(errors)} failed", file=sys.stderr, flush=True)
            progress.add(len(batches[number]), len(rows), len(errors), force=True,
                         tokens=sum(row["metadata"]["usage"]["completion_tokens"] for row in rows))
        if samples is not None:
            kept += sum(1 for row in rows if regenerated.usable(row["loss_mask"], run.config.max_seq_len))
            if kept >= samples:
                numbers = range(numbers.start, number + 1)
                break
    resumed = len(written & set(numbers))
    joined, joined_errors = [], []
    for number in numbers:
        rows_file, errors_file = chunk_paths(folder, number)
        joined.append(rows_file.read_text(encoding="utf-8"))
        joined_errors.append(errors_file.read_text(encoding="utf-8") if errors_file.is_file() else "")
    from specops.pipeline.regenerate.output import ERRORS_FILE, RESPONSES_FILE

    atomic.write_text(folder / ERRORS_FILE, "".join(joined_errors))
    atomic.write_text(folder / RESPONSES_FILE, "".join(joined))
    if generator is not None:
        progress.finish()
    report: dict[str, Any] = {"batches": len(numbers), "batches_resumed": resumed}
    if samples is not None:
        report["answered"] = min(len(source), numbers.stop * size)
    return report


def _steps(torch: Any, width: int, on_step: Callable[[int], None]) -> Any:
    """A stopping criterion that never stops: it tells `on_step` how many tokens the batch has generated, at
    every step of `generate` (one call, minutes long for a batch of long answers on a real model)."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Steps(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            on_step(input_ids.shape[1] - width)
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([Steps()])
