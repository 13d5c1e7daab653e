"""Online and hybrid training without a server: the run config's `hidden_states`, the placement of
server and trainer on one host, the disk budget's arithmetic, and the trainer's command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specops.contract.errors import BadInput
from specops.pipeline.extraction import budget
from specops.pipeline.extraction.hidden_states import write_sample
from specops.pipeline.run import load_run_config
from specops.pipeline.training.command import Generation, TrainPlan, build_train_command
from specops.pipeline.training.online import choose_placement, ended_how
from tests.support.agent import run_agent as agent

BASE = "model: m\ndata: d.jsonl\n"


def write_config(folder: Path, text: str) -> Path:
    path = folder / "runs" / "bad.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(BASE + text)
    return path


def test_offline_stays_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECOPS_WORKDIR", str(tmp_path))
    settings = load_run_config(write_config(tmp_path, "")).hidden_states
    assert (settings.mode, settings.disk_budget_gb, settings.placement) == ("offline", None, None)


def test_extraction_asks_the_runs_concurrency_of_speculators(tmp_path, monkeypatch):
    from specops.pipeline.extraction.vllm import generate_offline_argv
    from specops.pipeline.run import Run

    monkeypatch.setenv("SPECOPS_WORKDIR", str(tmp_path))
    write_config(tmp_path, "hidden_states:\n  concurrency: 1\n")
    argv = generate_offline_argv(Run("bad", tmp_path), "http://127.0.0.1:8000/v1", 6)
    assert argv[argv.index("--concurrency") + 1] == "1"  # one prompt at a time: bytes independent of batching
    write_config(tmp_path, "")
    argv = generate_offline_argv(Run("bad", tmp_path), "http://127.0.0.1:8000/v1", 6)
    assert argv[argv.index("--concurrency") + 1] == "8"


@pytest.mark.parametrize(("text", "message"), [
    ("hidden_states:\n  mode: streaming\n",
     "runs/bad.yaml: hidden_states.mode: must be 'offline', 'online' or 'hybrid'"),
    ("hidden_states:\n  mode: hybrid\n",
     "runs/bad.yaml: hidden_states: mode hybrid needs disk_budget_gb (extraction writes up to it)"),
    ("hidden_states:\n  mode: online\n  disk_budget_gb: 0\n",
     "runs/bad.yaml: hidden_states.disk_budget_gb: must be > 0"),
    ("hidden_states:\n  placement: halves\n",
     "runs/bad.yaml: hidden_states.placement: must be 'split' or 'shared'"),
    ("hidden_states:\n  concurrency: 0\n",
     "runs/bad.yaml: hidden_states.concurrency: must be > 0"),
])
def test_a_bad_hidden_states_section_is_exit_2_and_one_line(tmp_path, text, message):
    write_config(tmp_path, text)
    code, document, _ = agent(tmp_path, "run", "show", "--run", "bad")
    assert code == 2
    assert document["error"] == message


def test_a_cpu_host_runs_server_and_trainer_on_its_cores():
    placement = choose_placement(None, 0, {"kind": "cpu"})
    assert (placement.kind, placement.server_gpus, placement.trainer_gpus) == ("cpu", (), ())


def test_split_gives_the_server_the_plans_gpus_and_the_trainer_the_rest():
    placement = choose_placement(None, 8, {"kind": "split", "server_gpus": 4, "why": "the server on 4 GPU(s)"})
    assert placement.kind == "split"
    assert (placement.server_gpus, placement.trainer_gpus) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert placement.reason == "the plan: the server on 4 GPU(s)"


def test_shared_gpus_take_the_plans_lower_memory_share():
    placement = choose_placement(None, 8, {"kind": "shared", "server_gpus": 8,
                                           "server": {"gpu_memory_utilization": 0.55}})
    assert placement.kind == "shared"
    assert placement.server_gpus == placement.trainer_gpus == tuple(range(8))
    assert placement.server_memory_share == 0.55


def test_the_run_config_overrides_the_plan():
    split = {"kind": "split", "server_gpus": 4}
    assert choose_placement("shared", 8, split).kind == "shared"
    assert choose_placement("shared", 8, split, memory_share=0.3).server_memory_share == 0.3
    assert choose_placement(None, 8, split, server_gpus=6).trainer_gpus == (6, 7)


def test_a_split_that_leaves_the_trainer_nothing_is_bad_input():
    with pytest.raises(BadInput, match=r"^runs/r.yaml: hidden_states.server_gpus: 8 leaves none of the host's 8 GPUs"):
        choose_placement("split", 8, None, server_gpus=8, label="runs/r.yaml")


def test_a_row_file_is_never_larger_than_its_budgeted_size(tmp_path):
    import torch

    for tokens, layers, hidden, dtype in ((37, 4, 64, torch.float32), (200, 4, 64, torch.bfloat16)):
        size = write_sample(tmp_path, 0, torch.zeros(tokens, dtype=torch.int64),
                            torch.zeros(tokens, layers, hidden, dtype=dtype))
        estimate = budget.row_bytes(tokens, layers, hidden, str(dtype).removeprefix("torch."))
        assert size <= estimate <= size + budget.HEADER_BYTES


def test_hybrid_takes_the_leading_rows_that_fit():
    one = budget.row_bytes(100, 4, 64, "float32")
    assert budget.rows_within([100] * 10, 4, 64, "float32", 3 * one) == 3
    assert budget.rows_within([100] * 10, 4, 64, "float32", 3 * one - 1) == 2
    assert budget.rows_within([100] * 2, 4, 64, "float32", 10 * one) == 2
    assert budget.in_flight_rows(None, 0) == 1  # a CPU host loads one row at a time
    assert budget.in_flight_rows(None, 8) == 48  # speculators' 12 workers x prefetch 4


def test_the_online_trainer_generates_missing_rows_from_the_runs_server():
    plan = TrainPlan(verifier="/m", data_path=Path("/r/prepared"), hidden_states_path=Path("/r/hidden_states"),
                     save_path=Path("/r/checkpoints"), target_layer_ids=(1, 2, 3), draft_vocab_size=256,
                     generation=Generation("http://127.0.0.1:8123/v1", 30.0, 1, 3))
    command = build_train_command(plan, gpus=0)
    assert command[command.index("--on-missing") + 1] == "generate"
    assert command.count("--on-missing") == 1
    assert command[command.index("--vllm-endpoint") + 1] == "http://127.0.0.1:8123/v1"
    assert command[command.index("--request-timeout") + 1] == "30.0"
    assert command[command.index("--max-consecutive-generation-failures") + 1] == "3"


def test_how_the_trainer_ended_is_said_in_words():
    assert ended_how(-9, 123) == "the trainer (speculators train, pid 123) was killed by SIGKILL"
    assert ended_how(1, None) == "the trainer (speculators train) exited with status 1"


@pytest.mark.parametrize(("mode", "extracts"), [("offline", True), ("hybrid", True), ("online", False)])
def test_the_step_table_runs_extract_and_validate_unless_online(tmp_path, monkeypatch, mode, extracts):
    from specops.contract import step_table

    monkeypatch.setenv("SPECOPS_WORKDIR", str(tmp_path))
    config = load_run_config(write_config(tmp_path, f"hidden_states:\n  mode: {mode}\n  disk_budget_gb: 1\n"))
    for name in ("extract", "validate"):
        assert step_table.enabled(step_table.step(name), config) is extracts
    assert step_table.enabled(step_table.step("train"), config)


def test_the_watch_stops_the_trainer_once_the_bytes_on_disk_pass_the_budget(tmp_path):
    import threading

    from specops.pipeline.training.online import Watch
    from tests.support.agent import wait_until

    staging = tmp_path / "vllm_staging"
    staging.mkdir()
    (staging / "hs_a.safetensors").write_bytes(b"x" * 600)
    stopped = threading.Event()
    watch = Watch((tmp_path / "hidden_states", staging), 1000, lambda: None, tmp_path / "online.json",
                  period_s=0.01)
    watch.start(stopped.set)
    try:
        wait_until(lambda: watch.samples > 3, what="a few samples under the budget")
        assert not stopped.is_set() and watch.peak_bytes == 600
        (staging / "hs_b.safetensors").write_bytes(b"x" * 600)
        wait_until(stopped.is_set, what="the trainer stopped")
    finally:
        watch.stop()
    assert watch.reason.startswith("hidden states on disk: 1200 bytes in ")
    assert watch.reason.endswith("exceed hidden_states.disk_budget_gb (1000 bytes)")
    assert json.loads((tmp_path / "online.json").read_text())["peak_bytes"] == 1200


def test_the_watch_names_a_dead_server_within_a_second(tmp_path):
    import threading

    from specops.pipeline.training.online import Watch
    from tests.support.agent import wait_until

    alive = threading.Event()
    alive.set()
    stopped = threading.Event()
    watch = Watch((tmp_path,), None, lambda: None if alive.is_set() else "vLLM server job j died during training")
    watch.start(stopped.set)
    try:
        alive.clear()
        wait_until(stopped.is_set, timeout_s=2.0, what="the trainer stopped")
    finally:
        watch.stop()
    assert watch.reason == "vLLM server job j died during training"
