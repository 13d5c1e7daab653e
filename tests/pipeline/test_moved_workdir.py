"""A workdir moved or copied elsewhere is the same run: every step finds its work done.

Each step's inputs count paths inside the workdir relative to it (the training's verifier, data,
hidden states, vocabulary and checkpoints), so a copy of a finished run skips every step instead of
training again; a run trained before that rule, whose record holds the absolute-path inputs, is
still current where it was trained. Where the workdir was trained is gone once it has moved: its
checkpoints still name the target there, and evaluating them again loads the run's own target.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from specops.contract import step_table
from tests.support.agent import run_agent
from tests.support.finished import copy_of

STEPS = [step.name for step in step_table.STEPS if step.recorded]


def test_a_copy_of_a_finished_run_elsewhere_skips_every_step(finished: tuple[Path, dict], tmp_path: Path) -> None:
    root = copy_of(finished, tmp_path / "elsewhere")
    code, summary, stderr = run_agent(root, "pipeline", "--run", "tiny", timeout=600)
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
    # the step records its command and pinned numerics beside the inputs it hashes
    inputs = {key: value for key, value in record["inputs"].items() if key not in ("command", "pinned")}
    plan = inputs["plan"]
    assert plan["data_path"] == "./runs/tiny/prepared" and plan["verifier"] == "./models/tiny-llama"
    # what an older specops recorded: the same inputs with this workdir's absolute paths
    inputs["plan"] = {key: str(root / value[2:]) if value.startswith("./") else value for key, value in plan.items()}
    record["inputs_hash"] = config_hash(inputs)
    manifest_file.write_text(json.dumps(manifest))

    code, document, stderr = run_agent(root, "step", "train", "--run", "tiny", timeout=600)
    assert code == 0, stderr[-3000:]
    assert document["status"] == "skipped: unchanged"


def test_a_moved_run_evaluates_its_checkpoints_again_with_its_own_target(
        finished: tuple[Path, dict], tmp_path: Path) -> None:
    trained_at = copy_of(finished, tmp_path / "trained-here")
    for config_file in (trained_at / "runs" / "tiny").glob("**/config.json"):
        config = json.loads(config_file.read_text())
        verifier = config.get("speculators_config", {}).get("verifier")
        if verifier:  # the target where this copy was trained, as its own training would have written it
            verifier["name_or_path"] = str(trained_at / "models" / "tiny-llama")
            config_file.write_text(json.dumps(config))
    root = tmp_path / "moved"
    shutil.move(trained_at, root)
    assert not trained_at.exists()

    code, document, stderr = run_agent(root, "step", "evaluate", "--run", "tiny", "--prompts", "4", timeout=600)
    assert code == 0, stderr[-3000:]
    assert document["status"] == "done" and document["report"]["prompts"] == document["untrained"]["prompts"] == 4
    assert document["report"]["mean_acceptance_length"] > document["untrained"]["mean_acceptance_length"]
