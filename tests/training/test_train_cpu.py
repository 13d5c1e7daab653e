"""Step 4 for real: the tiny run trains on CPU through speculators 0.9.0 patched by the CPU patch set.

The wheel is unpacked into a throwaway site, patched with `specops patch apply`, and put first on the
trainer's PYTHONPATH; the run's inputs are generated in speculators' formats (tests/support/tiny_training.py).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from specops.pipeline.training.metrics import parse_log
from tests.support.tiny_training import AUX_LAYER_IDS, TinyHost, patched_host

pytestmark = [pytest.mark.slow, pytest.mark.wheels]


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> TinyHost:
    return patched_host(tmp_path_factory.mktemp("tiny-host"))


@pytest.fixture(scope="module")
def trained(host: TinyHost) -> Path:
    run_dir = host.add_run("tiny", epochs=1)
    vocab = host.agent("step", "vocab", "--run", "tiny")
    assert vocab["status"] == "done" and vocab["draft_vocab"] == 256
    document = host.agent("step", "train", "--run", "tiny")
    assert document["status"] == "done", document
    return run_dir


def test_training_writes_a_checkpoint_metrics_and_a_plot(host: TinyHost, trained: Path) -> None:
    checkpoint = trained / "checkpoints" / "0"
    for name in ("model.safetensors", "config.json", "optimizer_state_dict.pt", "training_state.json"):
        assert (checkpoint / name).is_file()
    report = host.agent("step", "metrics", "--run", "tiny")
    (epoch,) = report["epochs"]
    assert epoch["epoch"] == 0 and epoch["steps"] > 5
    assert epoch["train"]["loss"] > 0 and "full_acc_0" in epoch["train"] and epoch["val"]["loss"] > 0
    assert epoch["tokens_per_s"] > 0
    assert Path(report["plot"]).read_bytes()[:4] == b"\x89PNG"
    assert report["checkpoints"]["newest_epoch"] == 0


def test_a_second_train_with_unchanged_inputs_is_skipped(host: TinyHost, trained: Path) -> None:
    assert host.agent("step", "vocab", "--run", "tiny")["status"] == "skipped: unchanged"
    assert host.agent("step", "train", "--run", "tiny")["status"] == "skipped: unchanged"


def test_checkpoint_loads_with_speculators_model_class_and_gives_draft_logits(trained: Path) -> None:
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

    # saved in bf16 like every speculators checkpoint; compute in fp32 on CPU
    model = Eagle3DraftModel.from_pretrained(str(trained / "checkpoints" / "0")).float().eval()
    captured: list[torch.Tensor] = []
    model.lm_head.register_forward_hook(lambda _module, _inputs, output: captured.append(output))
    seq = 10
    with torch.no_grad():
        model(hidden_states=torch.randn(1, seq, len(AUX_LAYER_IDS) * 64),
              input_ids=torch.randint(0, 512, (1, seq)), document_ids=torch.zeros(1, seq, dtype=torch.long),
              ttt_steps=1)
    assert captured and captured[0].shape == (1, seq, 256)  # [batch, positions, draft vocab]


def test_training_killed_mid_epoch_resumes_where_it_stopped(host: TinyHost, trained: Path) -> None:
    run_dir = host.add_run("resume", epochs=2)
    host.agent("step", "vocab", "--run", "resume")
    checkpoints = run_dir / "checkpoints"
    first = host.start_agent("step", "train", "--run", "resume")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (checkpoints / "0" / "training_state.json").exists():
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)  # no chance to save anything more
    first.wait()
    saved = json.loads((checkpoints / "0" / "training_state.json").read_text())
    assert saved["global_step"] > 0

    resumed = host.agent("step", "train", "--run", "resume")
    assert resumed["status"] == "done"
    assert resumed["resume"].startswith("resuming from epoch")
    log = (checkpoints / "train.log").read_text()
    second_launch = log.split("### specops launch")[2]
    assert "Resuming" in second_launch and "Starting fresh" not in second_launch
    relaunched = [step.global_step for step in parse_log(log).steps if step.launch == 2]
    assert relaunched and min(relaunched) >= saved["global_step"]  # continued, not restarted from step 0
    assert resumed["checkpoints"]["newest_epoch"] == 1
