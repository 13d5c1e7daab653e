"""A workdir moved or copied elsewhere is the same run: every step finds its work done.

Each step's inputs count paths inside the workdir relative to it (the training's verifier, data,
hidden states, vocabulary and checkpoints), so a copy of a finished run skips every step instead of
training again; a run trained before that rule, whose record holds the absolute-path inputs, is
still current where it was trained.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.agent import run_agent
from tests.support.finished import copy_of

STEPS = ("regenerate", "prepare", "extract", "validate", "vocab", "train", "evaluate")


def test_a_copy_of_a_finished_run_elsewhere_skips_every_step(finished: tuple[Path, dict], tmp_path: Path) -> None:
    root = copy_of(finished, tmp_path / "elsewhere")
    code, summary, stderr = run_agent(root, "pipeline", "--run", "tiny", "--skip-doctor", timeout=600)
    assert code == 0, stderr[-3000:]
    assert {step: summary["steps"][step]["status"] for step in STEPS} == dict.fromkeys(STEPS, "skipped: unchanged")
    assert summary["evaluation"]["report"] == finished[1]["evaluation"]["report"]


def test_a_run_recorded_with_absolute_paths_is_still_current_where_it_was_trained(
        finished: tuple[Path, dict], tmp_path: Path) -> None:
    from specops.pipeline.run import config_hash

    root = copy_of(finished, tmp_path / "older")
    manifest_file = root / "runs" / "tiny" / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    record = manifest["steps"]["train"]
    inputs = {key: value for key, value in record["inputs"].items() if key != "command"}
    plan = inputs["plan"]
    assert plan["data_path"] == "./runs/tiny/prepared" and plan["verifier"] == "./models/tiny-llama"
    # what an older specops recorded: the same inputs with this workdir's absolute paths
    inputs["plan"] = {key: str(root / value[2:]) if value.startswith("./") else value for key, value in plan.items()}
    record["inputs_hash"] = config_hash(inputs)
    manifest_file.write_text(json.dumps(manifest))

    code, document, stderr = run_agent(root, "step", "train", "--run", "tiny", timeout=600)
    assert code == 0, stderr[-3000:]
    assert document["status"] == "skipped: unchanged"
