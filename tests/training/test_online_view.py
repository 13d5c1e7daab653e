"""Server and trainer side by side while a run trains online: what `status` reads on the host and what the
training view shows, from the files and log lines the training writes."""

from __future__ import annotations

import io
import json
from pathlib import Path

from remote.step_view import StepView
from remote.tasks.jobs import online_line
from specops.contract.protocol import TRAINER_ONLINE, TRAINER_START
from specops.jobs.liveness import online_progress

STEP_LINE = ("[17:18:32] INFO     train/loss_0=0.445, train/full_acc_0=0.5, train/loss=1.309, profile/fetch_ms=900.0, "
             "profile/tokens_per_s={tokens}, profile/fetch_frac={fetch}, epoch=0, global_step={step}")


def write_run(run_dir: Path, fetch: float, state: str = "running") -> None:
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "online.json").write_text(json.dumps({
        "state": state, "bytes": 200_000, "peak_bytes": 300_000, "budget_bytes": 1_000_000,
        "server": {"job": "vllm-server-1", "served": 40.0, "served_per_s": 3.5, "busy_share": 0.9}}))
    lines = [STEP_LINE.format(tokens=100.0, fetch=0.1, step=1), STEP_LINE.format(tokens=250.0, fetch=fetch, step=2)]
    (run_dir / "checkpoints" / "train.log").write_text("\n".join(lines) + "\n")


def test_status_reads_the_servers_rate_and_the_trainers_newest_step(tmp_path):
    write_run(tmp_path, fetch=0.8)
    progress = online_progress(tmp_path)
    assert progress["server"]["served_per_s"] == 3.5
    assert progress["trainer"]["tokens_per_s"] == 250.0
    assert progress["trainer"]["fetch_frac"] == 0.8
    assert progress["waits"] == "the trainer waits for the server"
    line = online_line(progress)
    assert line.startswith("server vllm-server-1: 3.5 hidden states/s | trainer: 250.0 tokens/s, 80% of each step")
    assert line.endswith("the trainer waits for the server | 0.2 MB on disk of 1.0 MB budget")


def test_a_trainer_that_rarely_waits_for_data_keeps_the_server_waiting(tmp_path):
    write_run(tmp_path, fetch=0.05)
    assert online_progress(tmp_path)["waits"] == "the server waits for the trainer"


def test_an_ended_online_training_is_not_progress(tmp_path):
    write_run(tmp_path, fetch=0.8, state="ended")
    assert online_progress(tmp_path) is None
    assert online_progress(tmp_path / "no-such-run") is None


def test_the_training_view_puts_the_server_beside_the_trainers_bar():
    stream = io.StringIO()
    view = StepView(stream)
    view.feed(TRAINER_START + json.dumps({"epochs": 1, "first_epoch": 0, "steps_per_epoch": 4}) + "\n")
    view.feed(TRAINER_ONLINE + json.dumps({"job": "vllm-server-1", "served_per_s": 3.5}) + "\n")
    view.feed(STEP_LINE.format(tokens=250.0, fetch=0.8, step=1) + "\n")
    bars = view.bars
    metrics = bars.progress.tasks[0].fields["metrics"]
    assert "250 tokens/s" in metrics
    assert "server 3.5 hidden states/s, trainer waits 80% of a step: the trainer waits for the server" in metrics
    view.close()


def test_the_one_line_per_host_shows_the_online_training_too(tmp_path):
    from remote.tasks.jobs import jobs_summary

    write_run(tmp_path, fetch=0.8)
    job = {"id": "train-1", "state": "running", "progress": online_progress(tmp_path)}
    assert jobs_summary({"jobs": [job]}).startswith("1 running; train-1 running server vllm-server-1: 3.5 hidden")
