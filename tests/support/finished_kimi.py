"""The Kimi-K2.5-shaped run as Kimi-K2.5 is published (runs/tiny-kimi-int4.yaml: the multimodal wrapper around a
DeepSeek-V3 MLA + MoE text model whose routed experts are stored as compressed-tensors int4, a remote-code
tokenizer; issue 59) through the whole hf pipeline, made once per test run and shared by every
xdist worker, as tests/support/finished.py makes the demo's.

The run is the repository's tiny-kimi at test size (`TEST_SIZE`): the wrapper's MoE target generates on a CPU
an order of magnitude slower than the tiny Llama, so fewer and shorter answers, fewer epochs and no scoring
after each epoch; the trained draft still clears the untrained one by far more than the tests ask. Tests
never change it: they copy it (`copy_of` in finished.py) and work on the copy.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.support.agent import REPO
from tests.support.finished import shared_pipeline

RUN = "tiny-kimi-int4"
MODEL = "models/tiny-kimi-k25-int4"
# runs/tiny-kimi-int4.yaml, key by key: 100 rows of 64-token answers; 2 epochs of short packed batches at a higher
# learning rate (as many steps as the full run's first epoch and a half); 10 held-out prompts, the last epoch
# evaluated (no scoring of every epoch)
TEST_SIZE = {"samples": 100, "regenerate": {"max_tokens": 64},
             "train": {"epochs": 2, "lr": 0.002, "total_seq_len": 256},
             "evaluate": {"heldout_prompts": 10, "max_tokens": 48, "epoch_prompts": 0, "checkpoint": "last"}}


def finished_kimi_pipeline(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """(workdir, the pipeline's summary): built by the first caller of this test run, read by the rest."""
    return shared_pipeline(config, tmp_path_factory, "finished-kimi", RUN, _build)


def _build(root: Path) -> None:
    """The workdir: the repository's runs/ with tiny-kimi at test size, its patches; the pipeline's first
    step makes the model and the conversations (`embedded: kimi-int4`)."""
    shutil.rmtree(root, ignore_errors=True)  # a build that failed in another worker
    root.mkdir()
    shutil.copytree(REPO / "runs", root / "runs")
    (root / "patches").symlink_to(REPO / "patches")
    path = root / "runs" / f"{RUN}.yaml"
    settings = yaml.safe_load(path.read_text())
    for key, value in TEST_SIZE.items():
        if isinstance(value, dict):
            settings[key].update(value)
        else:
            settings[key] = value
    path.write_text(yaml.safe_dump(settings, sort_keys=False))
