"""The doctor's view of a named run: runs/<name>.yaml turned into the settings the checks read.

Kept apart from the checks so they stay standard-library only: this module loads the run config
(pydantic) and asks the pipeline's own command builders for the flags each step will pass, so the
doctor checks exactly the command lines that will be launched.
"""

from __future__ import annotations

import json
from typing import Any


def _gpu_count() -> int:
    from pathlib import Path

    return sum(1 for node in Path("/dev").glob("nvidia[0-9]*") if node.name[6:].isdigit())


def _flags(argv: list[str]) -> list[str]:
    return [arg for arg in argv if arg.startswith("--")]


def run_settings_json(name: str) -> str:
    from specops.pipeline.config import Run

    run = Run(name)
    if run.config.embedded == "tiny":
        # The embedded model is generated (deterministically, in about a second) by the run's first
        # step anyway; making it now lets the doctor check the run against it like any other target.
        from specops.paths import workdir
        from specops.pipeline.tiny import generate

        generate(workdir())
    gpus = _gpu_count()
    described = run.describe(gpus)
    derived = described["derived"]
    settings: dict[str, Any] = {
        "model_path": derived["model_path"],
        "trust_remote_code": run.config.trust_remote_code,
        "layer_ids": derived["layer_ids"],
        "draft_vocab_size": run.config.draft.vocab_size,
        "samples": run.config.samples,
        "max_seq_len": run.config.max_seq_len,
        "backend": derived["backend"],
        "output_dir": derived["paths"]["hidden_states"],
        "staging_dir": str(run.paths.run_dir / "vllm-staging"),
    }
    try:
        from specops.pipeline import train_commands
        from specops.pipeline.train import build_train_command

        settings["train_flags"] = _flags(build_train_command(train_commands.train_plan(run), gpus))
    except Exception:  # the model may not exist yet (embedded runs make it first): flags checked later
        pass
    if settings["backend"] == "vllm":
        try:
            from specops.pipeline.vllm_server import build_serve_command

            argv, _env = build_serve_command(run, gpus, run.config.vllm.port, run.paths.workdir)
            settings["serve_flags"] = _flags(argv)
        except Exception:
            pass
    return json.dumps(settings)
