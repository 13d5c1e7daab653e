"""Regenerate with the hf backend: speculators' row format, resumable to the byte, and in the manifest.

The target (the tiny random Llama) answers every prompt of the demo data except the held-out ones;
a kill -9 at any moment followed by a rerun gives the very bytes of an uninterrupted run, no
conversation twice; a changed target makes regenerate run again and invalidates what follows it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support.agent import run_agent as agent
from tests.support.agent import start_agent as agent_popen

RUN = ("--run", "tiny")


def _folder(root: Path) -> Path:
    return root / "runs" / "tiny" / "regenerated"


def _rows(root: Path) -> list[dict]:
    return [json.loads(line) for line in (_folder(root) / "responses.jsonl").read_text().splitlines()]


def test_every_prompt_is_answered_once_in_speculators_row_format(regenerated: Path) -> None:
    from speculators.cli.regenerate_responses import _sample_from_response
    from transformers import AutoTokenizer

    source = [json.loads(line) for line in (_folder(regenerated) / "source.jsonl").read_text().splitlines()]
    rows = _rows(regenerated)
    assert len(source) == 300 - 2 - 20  # two malformed lines, twenty held out
    assert Counter(row["id"] for row in rows).most_common(1)[0][1] == 1
    errors = [json.loads(line) for line in (_folder(regenerated) / "responses.errors.jsonl").read_text().splitlines()]
    # every prompt once: answered, or (an answer of nothing but unfinished UTF-8 bytes, empty as vLLM sees it)
    # failed as speculators fails it
    assert {row["primary_id"] for row in rows} | {error["id"] for error in errors} == {row["id"] for row in source}
    assert not {row["primary_id"] for row in rows} & {error["id"] for error in errors}
    assert all("empty assistant generation" in error["metadata"]["error"] for error in errors)

    # Each row is what speculators' own code builds from a chat-completion response carrying the same tokens.
    tokenizer = AutoTokenizer.from_pretrained(str(regenerated / "models" / "tiny-llama"))
    for row in rows[:5] + rows[-5:]:
        prompt_length = row["loss_mask"].index(1)
        completion = row["input_ids"][prompt_length:]
        response = {"choices": [{"message": {"content": tokenizer.decode(completion, skip_special_tokens=True)},
                                 "token_ids": completion, "finish_reason": row["metadata"]["finish_reason"]}],
                    "prompt_token_ids": row["input_ids"][:prompt_length], "usage": row["metadata"]["usage"]}
        theirs, _message, _calls = _sample_from_response(
            response, detokenize=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
            conv_id=row["primary_id"], sample_index=int(row["id"].rsplit("_gen", 1)[1]), idx=row["metadata"]["idx"],
            endpoint="hf", sampling_params={"temperature": 0.0})
        assert theirs == row
        assert len(completion) <= 24 and set(row["loss_mask"][prompt_length:]) == {1}


def test_the_step_report_counts_answers_failures_and_held_out_prompts(regenerated: Path) -> None:
    from specops.pipeline.run import Manifest

    record = Manifest(regenerated / "runs" / "tiny").record("regenerate")
    assert record["status"] == "done"
    counts = record["counts"]
    errors = (_folder(regenerated) / "responses.errors.jsonl").read_text().splitlines()
    assert counts["conversations"] + counts["failed"] == 278 and counts["failed"] == len(errors) < 10
    assert counts["empty"] == 0 and counts["missing"] == 0
    assert counts["held_out"] == 20 and counts["rows"] == len(_rows(regenerated))
    assert record["inputs"]["sampling"] == {"concurrency": 16, "max_tokens": 24, "seed": 0, "temperature": 0.0,
                                            "top_p": 1.0}
    assert record["inputs"]["model_digest"]


def test_answering_is_shown_as_it_goes_with_answers_a_second_and_an_eta(regenerated: Path) -> None:
    from tests.regenerate.conftest import LOG_FILE

    counts = json.loads((regenerated / "runs" / "tiny" / "manifest.json").read_text())["steps"]["regenerate"]["counts"]
    lines = [line for line in (regenerated.parent / LOG_FILE).read_text().splitlines()
             if re.match(r"regenerate: \d+/278 conversations, ", line)]
    assert lines[0].startswith("regenerate: 0/278 conversations, 0 answers, ") and lines[0].endswith("ETA ?")
    # inside a batch, at every generation step (SPECOPS_PROGRESS_S=0 here; 10 s by default)
    assert any(re.search(r"answers/s, ETA \d+s \(batch 2/18, turn 1 of 16 conversations: \d+ of at most 24 "
                         r"tokens\)$", line) for line in lines)
    # after each batch of 16, with the rate and what is left
    ends = [line for line in lines if not line.endswith(")")]
    assert any(line.startswith("regenerate: 16/278 conversations, ") for line in ends)
    failed = f"{counts['failed']} failed, " if counts["failed"] else ""
    assert ends[-1].startswith(f"regenerate: 278/278 conversations, {counts['rows']} answers, {failed}")
    assert ends[-1].endswith("ETA 0s")
    shown = json.loads((_folder(regenerated) / "progress.json").read_text())  # what `invoke status` reads
    assert shown["state"] == "done" and shown["done"] == shown["total"] == 278 and shown["answers_per_s"] > 0


def _kill_after(root: Path, chunks: int) -> None:
    process = agent_popen(root, "step", "regenerate", *RUN)
    chunk_folder = _folder(root) / "chunks"
    deadline = time.monotonic() + 300
    while len(list(chunk_folder.glob("batch-*[0-9].jsonl"))) < chunks:
        assert process.poll() is None, process.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "regenerate wrote no chunk in time"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


@pytest.mark.slow  # long: scheduled among the first (tests/support/workers.py)
def test_a_killed_regenerate_resumes_to_the_same_bytes_none_twice(regen_workdir: Path, regenerated: Path,
                                                                  tmp_path: Path) -> None:
    root = tmp_path / "w"
    shutil.copytree(regen_workdir, root, symlinks=True)
    _kill_after(root, 1)  # killed early: one batch written
    _kill_after(root, 9)  # killed again later, in the middle of resuming
    assert not (_folder(root) / "responses.jsonl").exists()
    code, document, stderr = agent(root, "step", "regenerate", *RUN, timeout=600)
    assert code == 0, stderr[-3000:]
    assert document["batches_resumed"] >= 9 and "resuming" in stderr
    assert (_folder(root) / "responses.jsonl").read_bytes() == (_folder(regenerated) / "responses.jsonl").read_bytes()
    assert document["counts"] == json.loads((regenerated / "runs" / "tiny" / "manifest.json").read_text())[
        "steps"]["regenerate"]["counts"]


def test_a_rerun_with_the_same_inputs_skips(regenerated: Path, tmp_path: Path) -> None:
    root = tmp_path / "w"
    shutil.copytree(regenerated, root, symlinks=True)
    code, document, _ = agent(root, "step", "regenerate", *RUN)
    assert code == 0 and document["status"] == "skipped: unchanged"


@pytest.mark.slow  # long: scheduled among the first (tests/support/workers.py)
def test_a_changed_target_regenerates_and_invalidates_everything_after(regenerated: Path, tmp_path: Path) -> None:
    from specops.pipeline.run import Manifest

    root = tmp_path / "w"
    shutil.copytree(regenerated, root, symlinks=True)
    code, prepared, stderr = agent(root, "step", "prepare", *RUN, timeout=600)
    assert code == 0 and prepared["status"] == "done", stderr[-3000:]
    assert prepared["counts"]["regenerated"] is True and prepared["counts"]["held_out"] == 20
    code, _extracted, stderr = agent(root, "step", "extract", *RUN, "--samples", "4", timeout=600)
    assert code == 0, stderr[-3000:]
    before = (_folder(root) / "responses.jsonl").read_bytes()

    config_file = root / "models" / "tiny-llama" / "config.json"
    config = json.loads(config_file.read_text())
    config["rms_norm_eps"] = 1e-3  # another target: same files, different numbers
    config_file.write_text(json.dumps(config))
    code, again, stderr = agent(root, "step", "prepare", *RUN, timeout=600)
    assert code == 0 and again["status"] == "done", stderr[-3000:]
    manifest = Manifest(root / "runs" / "tiny")
    assert manifest.record("extract") is None and not (root / "runs" / "tiny" / "hidden_states").exists()
    assert manifest.record("regenerate")["inputs"]["model_digest"] != json.loads(
        (regenerated / "runs" / "tiny" / "manifest.json").read_text())["steps"]["regenerate"]["inputs"]["model_digest"]
    assert manifest.record("prepare")["inputs"]["regenerate"] == manifest.inputs_hash("regenerate")
    assert (_folder(root) / "responses.jsonl").read_bytes() != before  # the new target's own answers


@pytest.mark.slow  # long: scheduled among the first (tests/support/workers.py)
def test_ten_samples_are_answered_first_and_more_samples_later_to_the_same_bytes(
        regen_workdir: Path, regenerated: Path, tmp_path: Path) -> None:
    from specops.pipeline.run import Manifest

    root = tmp_path / "w"
    shutil.copytree(regen_workdir, root, symlinks=True)
    code, extracted, stderr = agent(root, "step", "extract", *RUN, "--samples", "10", timeout=600)
    assert code == 0, stderr[-3000:]
    assert extracted["counts"]["samples"] == 10
    counts = Manifest(root / "runs" / "tiny").record("regenerate")["counts"]
    # one batch of 16 conversations holds ten rows: the other 262 conversations were not asked
    assert counts["answered"] == 16 and counts["complete"] is False and counts["missing"] == 0
    whole = (_folder(regenerated) / "responses.jsonl").read_bytes()
    first = (_folder(root) / "responses.jsonl").read_bytes()
    assert whole.startswith(first) and len(first) < len(whole) / 10  # the whole run's first answers, to the byte
    hidden = root / "runs" / "tiny" / "hidden_states" / "hs_0.safetensors"
    written_at = hidden.stat().st_mtime_ns

    code, prepared, stderr = agent(root, "step", "prepare", *RUN, "--samples", "60", timeout=600)
    assert code == 0 and prepared["counts"]["rows"] == 60, stderr[-3000:]
    counts = Manifest(root / "runs" / "tiny").record("regenerate")["counts"]
    assert 16 < counts["answered"] < 278 and counts["answered"] % 16 == 0 and counts["complete"] is False
    more = (_folder(root) / "responses.jsonl").read_bytes()
    assert more.startswith(first) and whole.startswith(more) and len(more) > len(first)
    manifest = Manifest(root / "runs" / "tiny")
    assert manifest.record("extract")["status"] == "done" and hidden.stat().st_mtime_ns == written_at  # kept
    code, again, _ = agent(root, "step", "extract", *RUN, "--samples", "10", timeout=600)
    assert code == 0 and again["status"] == "skipped: unchanged"


def test_a_prompt_too_long_for_max_seq_len_is_never_asked(regen_workdir: Path, regenerated: Path,
                                                          tmp_path: Path) -> None:
    """A prompt of max_seq_len tokens or more leaves no answer token within the rows prepare keeps: hf never asks
    it (one such prompt would pad its whole batch to its length) and names it in the errors file, as vLLM's
    server refuses a prompt longer than its model length; the prompts that fit are answered as before."""
    from tests.support.runs import edit_run

    first_turns = {row["primary_id"]: row["metadata"]["usage"]["prompt_tokens"] for row in _rows(regenerated)
                   if row["id"].endswith("_gen0")}
    limit = sorted(first_turns.values())[len(first_turns) // 2]  # about half the prompts fit
    root = tmp_path / "w"
    shutil.copytree(regen_workdir, root, symlinks=True)
    edit_run(root / "runs" / "tiny.yaml", max_seq_len=limit)
    code, document, stderr = agent(root, "step", "regenerate", *RUN, timeout=600)
    assert code == 0, f"{document}\n{stderr[-3000:]}"
    answered = {row["primary_id"]: row["metadata"]["usage"]["prompt_tokens"] for row in _rows(root)
                if row["id"].endswith("_gen0")}
    errors = [json.loads(line) for line in (_folder(root) / "responses.errors.jsonl").read_text().splitlines()]
    refused = {error["id"]: error["metadata"]["error"] for error in errors
               if "leaves no answer within max_seq_len" in error["metadata"]["error"]}
    assert answered and refused
    assert all(tokens < limit for tokens in answered.values())
    for conversation, reason in refused.items():
        tokens = int(re.search(r"prompt of (\d+) tokens", reason).group(1))
        assert tokens >= limit and first_turns.get(conversation, tokens) == tokens
    # what fits is answered exactly as without the limit
    assert {key: first_turns[key] for key in answered} == answered
