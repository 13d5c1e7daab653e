"""Run-config variants for tests: the demo's runs/tiny.yaml, edited by key."""

from __future__ import annotations

from pathlib import Path

import yaml


def edit_run(path: Path, **sections: dict | object) -> None:
    """Set top-level keys (a dict value updates that section key by key)."""
    config = yaml.safe_load(path.read_text())
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key].update(value)
        else:
            config[key] = value
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def from_source_conversations(path: Path) -> None:
    """The tiny run as it trains on the dataset's own answers: no regenerate, no held-out prompts, no evaluate.

    The tests of prepare/extract/validate on the source data read those rows exactly (line numbers,
    malformed records, 200 samples)."""
    edit_run(path, regenerate={"enabled": False}, evaluate={"enabled": False, "heldout_prompts": 0})
