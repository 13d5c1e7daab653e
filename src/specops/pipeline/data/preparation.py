"""The prepare step: conversations -> token ids, assistant-only loss mask, token frequencies.

Writes exactly what `speculators prepare-data` (0.9) writes, so speculators' own commands can take
over from here: a `datasets` folder saved with save_to_disk whose columns are input_ids
(list of int32, as `datasets` stores a column of that name), loss_mask (list of int64) and seq_len
(int64), formatted as torch; and token_freq.pt beside it, a torch-saved {token_id: count} over
the loss-masked tokens, which `speculators train --data-path` reads from that folder.

Unlike speculators, which fans a conversation out into one row per assistant turn, a row here is
a whole conversation with every assistant turn supervised: one forward pass per conversation.
Row i of the dataset is the sample whose hidden states go to hs_{i}.safetensors.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specops.contract.errors import BadInput
from specops.host import atomic
from specops.host.atomic import replace_folder
from specops.pipeline.data import heldout
from specops.pipeline.data.conversations import Conversation, Malformed, read_conversations
from specops.pipeline.data.regenerated import regenerated_rows
from specops.pipeline.run import (
    Manifest,
    Run,
    StepContext,
    StepReport,
    config_hash,
    file_digest,
    tokenizer_digest,
)


class UnstableTemplate(ValueError):
    """Rendering a prefix of the conversation does not give a prefix of the full rendering."""


def render_ids(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def tokenise_with_mask(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """Token ids of the conversation and a mask that is 1 exactly on the assistants' replies.

    Each assistant turn's span runs from the end of the rendered prefix with the generation prompt
    (the context the model sees when it starts replying) to the end of the rendering that includes
    the reply (its end-of-turn tokens included: the model must learn to stop). Both renderings
    must be prefixes of the full rendering; templates that rewrite history break that and raise
    UnstableTemplate. Trailing non-assistant turns are dropped: nothing learns from them.
    """
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant" and i > 0), default=None)
    if last is None:
        raise ValueError("no assistant turn after some context")
    messages = messages[: last + 1]
    full = render_ids(tokenizer, messages, generation_prompt=False)
    mask = [0] * len(full)
    for turn, message in enumerate(messages):
        if message["role"] != "assistant" or turn == 0:
            continue
        start = render_ids(tokenizer, messages[:turn], generation_prompt=True)
        end = render_ids(tokenizer, messages[: turn + 1], generation_prompt=False)
        if full[: len(start)] != start or full[: len(end)] != end or len(end) < len(start):
            raise UnstableTemplate(f"chat template is not prefix-stable at assistant turn {turn}")
        mask[len(start): len(end)] = [1] * (len(end) - len(start))
    return full, mask


@dataclass
class Prepared:
    input_ids: list[list[int]] = field(default_factory=list)
    loss_mask: list[list[int]] = field(default_factory=list)
    source_lines: list[int] = field(default_factory=list)
    malformed: list[Malformed] = field(default_factory=list)
    skipped: list[Malformed] = field(default_factory=list)
    truncated: int = 0


def build_rows(tokenizer: Any, records: Any, max_seq_len: int, samples: int | None) -> Prepared:
    """Tokenise records in file order until `samples` usable rows are made."""
    out = Prepared()
    for record in records:
        if isinstance(record, Malformed):
            out.malformed.append(record)
            continue
        if samples is not None and len(out.input_ids) >= samples:
            continue  # keep reading: malformed lines further down are still reported
        assert isinstance(record, Conversation)
        try:
            ids, mask = tokenise_with_mask(tokenizer, record.messages)
        except ValueError as exc:  # UnstableTemplate included
            out.skipped.append(Malformed(record.line, str(exc)))
            continue
        except Exception as exc:  # a template may raise anything on odd content; one record, not the run
            out.skipped.append(Malformed(record.line, f"chat template failed: {type(exc).__name__}: {exc}"))
            continue
        if len(ids) > max_seq_len:
            ids, mask = ids[:max_seq_len], mask[:max_seq_len]
            out.truncated += 1
        if not any(mask):
            out.skipped.append(Malformed(record.line, f"no assistant tokens within max_seq_len {max_seq_len}"))
            continue
        out.input_ids.append(ids)
        out.loss_mask.append(mask)
        out.source_lines.append(record.line)
    return out


def token_frequencies(rows: Prepared) -> dict[int, int]:
    counts: Counter[int] = Counter()
    for ids, mask in zip(rows.input_ids, rows.loss_mask, strict=True):
        counts.update(token for token, keep in zip(ids, mask, strict=True) if keep)
    return dict(sorted(counts.items()))


def save_prepared(rows: Prepared, target: Path) -> None:
    """Write the dataset and token_freq.pt into a staging folder, then rename it into place."""
    import datasets
    import torch

    features = datasets.Features({
        "input_ids": datasets.List(datasets.Value("int32")),
        "loss_mask": datasets.List(datasets.Value("int64")),
        "seq_len": datasets.Value("int64"),
    })
    table = {"input_ids": rows.input_ids, "loss_mask": rows.loss_mask,
             "seq_len": [len(ids) for ids in rows.input_ids]}
    dataset = datasets.Dataset.from_dict(table, features=features)
    dataset.set_format(type="torch")

    def build(staging: Path) -> None:
        dataset.save_to_disk(str(staging))
        torch.save(token_frequencies(rows), staging / "token_freq.pt")

    replace_folder(target, build)


def prepare_inputs(run: Run) -> dict[str, Any]:
    """What the prepared rows depend on, for the manifest's skip decision.

    The number of rows is not part of it: rows are taken in file order, so row i is the same
    whatever N is, and the hidden states already extracted for rows 0..N-1 stay valid when a
    later run asks for more (or fewer) samples."""
    config = run.config
    data_path = run.paths.resolve(config.data)
    regenerated = Manifest(run.paths.run_dir).inputs_hash("regenerate") if config.regenerate.enabled else None
    return {
        "regenerate": regenerated,
        "heldout_prompts": config.evaluate.heldout_prompts,
        "model": config.model,
        "tokenizer": tokenizer_digest(run.model_path),
        "data": config.data,
        "data_digest": file_digest(data_path) if data_path.is_file() else None,
        "max_seq_len": config.max_seq_len,
        "trust_remote_code": config.trust_remote_code,
    }


def remakes(run: Run, samples: int | None, covering: bool, inputs_hash: str | None = None) -> tuple[bool, bool]:
    """(same source, whether prepare makes its rows again) for N = `samples`. `covering`: prepare runs only
    as what a later step reads (`step extract`), so rows already prepared for a larger N serve (rows are taken
    in file order: the first N of more rows are the N rows), and nothing trained on them is retired."""
    manifest = Manifest(run.paths.run_dir)
    record = manifest.record("prepare") or {}
    inputs_hash = inputs_hash or config_hash(prepare_inputs(run))
    same_source = manifest.is_current("prepare", inputs_hash) and (run.paths.prepared / "dataset_info.json").exists()
    asked = record.get("counts", {}).get("samples_asked", "?")
    if same_source and asked == samples:
        return True, False
    if same_source and covering and samples is not None and (asked is None or (
            isinstance(asked, int) and asked >= samples)):
        return True, False
    return same_source, True


def retired_by_prepare(same_source: bool) -> list[str]:
    """The steps a re-made prepare drops: every dependant (extract's per-row files stay when only N changes)."""
    from specops.pipeline.run import dependents

    return [name for name in dependents("prepare") if not (same_source and name == "extract")]


def prepare(run: Run, samples: int | None, strict: bool, covering: bool = False) -> dict[str, Any]:
    """Run the prepare step (or skip it when its inputs and its N are unchanged); the step's report.

    N = `samples`, the step context's (--samples, else the run's `samples`: applied by the engine); None:
    every usable row. Only N changed: the rows are re-made, the extracted hidden states are kept (they are
    per row) and the steps that read every row (vocab, validate, train) are invalidated."""
    inputs = prepare_inputs(run)
    inputs_hash = config_hash(inputs)
    manifest = Manifest(run.paths.run_dir)
    record = manifest.record("prepare") or {}
    same_source, remake = remakes(run, samples, covering, inputs_hash)
    if not remake:
        malformed = record.get("counts", {}).get("malformed") or 0
        if strict and malformed:  # skipped or not, --strict judges the data the rows come from
            raise BadInput(f"{run.paths.resolve(run.config.data)}: {malformed} malformed records (--strict); the "
                           f"lines are in {run.paths.prepare_report}")
        return {"step": "prepare", "status": "skipped: unchanged", "inputs_hash": inputs_hash,
                "counts": record.get("counts", {})}
    # a finished training these rows would retire: one line naming --retire, before any tokenizer loads
    manifest.refuse_retiring(retired_by_prepare(same_source), "prepare")

    data_path = run.paths.resolve(run.config.data)
    if (data_path.suffix in (".json", ".jsonl") or data_path.exists()) and not data_path.is_file():
        raise BadInput(f"{run.label}: data: {data_path} is not a file")
    records = list(read_conversations(run.config.data, data_path))
    if strict:  # before loading the tokenizer: a strict failure is quick
        lines = [str(record.line) for record in records if isinstance(record, Malformed)]
        if lines:
            raise BadInput(f"{data_path}: {len(lines)} malformed records (--strict) at lines {', '.join(lines)}")
    # Held-out prompts (chosen by content) are set aside for evaluation: no training row comes from them.
    conversations = [record for record in records if isinstance(record, Conversation)]
    held = heldout.choose(conversations, run.config.evaluate.heldout_prompts)
    if run.config.regenerate.enabled:
        rows = Prepared(**regenerated_rows(run, samples))
        rows.malformed = [record for record in records if isinstance(record, Malformed)]
    else:
        training = [record for record in records
                    if not (isinstance(record, Conversation) and heldout.content_key(record.messages) in held)]
        rows = build_rows(load_tokenizer(run), training, run.config.max_seq_len, samples)
    malformed = [{"line": m.line, "reason": m.reason} for m in rows.malformed]
    skipped = [{"line": m.line, "reason": m.reason} for m in rows.skipped]
    if not rows.input_ids:
        raise BadInput(f"{data_path}: no usable conversations ({len(malformed)} malformed, {len(skipped)} skipped)")

    with manifest.recorded("prepare", inputs_hash, {**inputs, "samples": samples},
                           keep=("extract",) if same_source else ()) as outcome:
        save_prepared(rows, run.paths.prepared)
        held_count = heldout.write_prompts(run.paths.heldout, conversations, held)
        # "rows": N, the same N rows every later step reads; "source_lines": which lines of the data they are
        counts = outcome.counts = {
            "rows": len(rows.input_ids), "samples_asked": samples, "source_lines": rows.source_lines,
            "tokens": sum(len(ids) for ids in rows.input_ids),
            "loss_tokens": sum(sum(mask) for mask in rows.loss_mask), "truncated": rows.truncated,
            "malformed": len(malformed), "skipped": len(skipped),
            "held_out": held_count, "regenerated": run.config.regenerate.enabled}
        atomic.write_json(run.paths.prepare_report, {"source_lines": rows.source_lines, "malformed": malformed,
                                                     "skipped": skipped, "counts": counts})
    said_before = (record.get("inputs") or {}).get("data_digest") == inputs["data_digest"]
    if (malformed or skipped) and not said_before:  # once per change of the data; the full list is in the report
        print(f"{data_path.name}: {len(malformed)} malformed and {len(skipped)} unusable record(s) left out; "
              f"the full list is in {run.paths.prepare_report}", file=sys.stderr)
    print(f"prepared {counts['rows']} rows (data lines {rows.source_lines[0]}..{rows.source_lines[-1]}), "
          f"{counts['tokens']} tokens into {run.paths.prepared}", file=sys.stderr)
    return {"step": "prepare", "status": "done", "inputs_hash": inputs_hash, "counts": counts,
            "malformed": malformed, "skipped": skipped, "output": str(run.paths.prepared)}


def load_tokenizer(run: Run) -> Any:
    from transformers import AutoTokenizer

    if not (run.model_path / "config.json").exists() and not (run.model_path / "tokenizer_config.json").exists():
        raise BadInput(f"{run.label}: model: {run.model_path} holds no model or tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(str(run.model_path), trust_remote_code=run.config.trust_remote_code)
    if getattr(tokenizer, "chat_template", None) is None:
        raise BadInput(f"{run.label}: model: the tokenizer of {run.model_path} has no chat template")
    return tokenizer


def pipeline_step(context: StepContext) -> StepReport:
    report = prepare(context.run, context.samples, False, covering=context.reading_for not in (None, "prepare"))
    counts = report.get("counts", {})
    return {**report, "figures": {"tokens": counts.get("tokens"), "loss_tokens": counts.get("loss_tokens")}}
