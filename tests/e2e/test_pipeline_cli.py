"""The pipeline through the real `invoke` tasks, on `local` and over the real sshd, on the tiny model.

These are the user's flows (`invoke extract --samples 10` and `invoke validate`: test_samples_cli.py): a
doctor error refusing a launch, `invoke pipeline` twice over SSH on a smaller run (the first runs every
step and ends with the draft's acceptance on held-out prompts, the second skips every step), and on
`local`, in a copy of a finished run (tests/support/finished.py), a pipeline that skips every step and
fetches, a changed draft vocabulary re-running only vocab and train, a killed training resuming, and
`invoke fetch` bringing home a checkpoint that speculators loads. Over SSH, `invoke pipeline` (doctor,
launch, follow, fetch) logs in to the real sshd exactly once, counted in its log.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from specops.contract import step_table
from tests.support.cli import Cli
from tests.support.finished import copy_of
from tests.support.repo import REPO
from tests.support.sshd import SshServer

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def _workdir(tmp_path: Path, host_name: str) -> Path:
    return tmp_path / ("local-workdir" if host_name == "local" else "loop-workdir")


def test_extract_refuses_to_start_when_the_doctor_finds_an_error(cli: Cli, tmp_path: Path) -> None:
    workdir = _workdir(tmp_path, "local")
    assert cli("check", "--host", "local").exit_code == 0  # installs the agent and runs/tiny.yaml
    config = yaml.safe_load((workdir / "runs" / "tiny.yaml").read_text())
    config["train"]["extra_args"] = ["--no-such-flag"]
    config["regenerate"]["enabled"] = False  # the launch is what this is about, not the answers before it
    (workdir / "runs" / "tiny.yaml").write_text(yaml.safe_dump(config))
    refused = cli("extract", "--host", "local", "--samples", "2", timeout=600)
    assert refused.exit_code == 1
    assert "doctor found" in refused.stderr and "--no-such-flag" in refused.stdout + refused.stderr
    assert cli("status", "--host", "local", "--json").json()["jobs"] == []  # nothing was launched
    skipped = cli("extract", "--host", "local", "--samples", "2", "--skip-doctor", "--json", timeout=600)
    assert skipped.exit_code == 0, skipped.stderr[-2000:]
    job = cli("status", "--host", "local", "--json").json()["jobs"][0]
    assert job["meta"]["doctor"] == {"skipped": True}


# Over SSH the flow is what is tested, not how well the draft learns (the local run below checks
# that on the demo's own settings): fewer rows, shorter answers, two short epochs, four prompts.
SSH_SAMPLES, SSH_PROMPTS = 48, 4


def _small_runs(tmp_path: Path) -> Path:
    runs = tmp_path / "my-runs"
    runs.mkdir()
    config = yaml.safe_load((REPO / "runs" / "tiny.yaml").read_text())
    config["samples"] = SSH_SAMPLES
    config["train"]["epochs"] = 2
    config["regenerate"]["max_tokens"] = 32
    config["evaluate"].update(heldout_prompts=SSH_PROMPTS, max_tokens=16)
    (runs / "tiny.yaml").write_text(yaml.safe_dump(config))
    return runs


def _assert_first_run(summary: dict, fetched: Path, host_name: str) -> None:
    """Every step ran; the loss fell; the fetch brought a checkpoint, the plots and the evaluation."""
    assert summary["doctor"][host_name]["ok"] is True  # checked before the launch, once
    assert {name: info["status"] for name, info in summary["steps"].items()} == {
        "patches": "ok", "regenerate": "done", "prepare": "done", "extract": "done", "validate": "done",
        "vocab": "done", "train": "done", "evaluate": "done"}
    assert summary["samples"] == SSH_SAMPLES and summary["fidelity"] >= 0.98
    assert summary["loss_last"] < summary["loss_first"]
    _assert_evaluated_and_fetched(summary, fetched, host_name, prompts=SSH_PROMPTS, learned=False)
    # the agent came with its bundle, and the workstation's revision with it: the record names this checkout's
    record = json.loads(Path(summary["evaluation"]["record"]).read_text())
    state = Path(summary["evaluation"]["record"]).parents[3] / "state"  # the host's workdir/state
    assert record["specops"]["from"] == "sync" and record["specops"]["bundle"] == (state / "agent.sha256").read_text()
    assert subprocess.run(["git", "merge-base", "--is-ancestor", record["specops"]["commit"], "HEAD"],
                          cwd=REPO).returncode == 0
    assert record["patches"] and all(entry["verify"] == "ok" for entry in record["patches"].values())


def _assert_evaluated_and_fetched(summary: dict, fetched: Path, host_name: str, prompts: int = 20,
                                  learned: bool = True) -> None:
    """The run ends with the draft's acceptance on held-out prompts, trained against untrained (on the
    demo's settings the trained draft is clearly better: `learned`); the fetch brought a checkpoint, the
    plots and the evaluation."""
    assert summary["ok"] is True
    assert summary["fetched"] == str(fetched / host_name / "tiny")
    trained, untrained = summary["evaluation"]["report"], summary["evaluation"]["untrained"]
    assert trained["prompts"] == untrained["prompts"] == prompts and trained["backend"] == "hf"
    assert trained["mean_acceptance_length"] >= 1.0 and untrained["mean_acceptance_length"] >= 1.0
    if learned:
        assert trained["mean_acceptance_length"] > untrained["mean_acceptance_length"] + 0.4
    checkpoint = fetched / host_name / "tiny" / "checkpoint"
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "config.json").is_file()
    assert (fetched / host_name / "tiny" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (fetched / host_name / "tiny" / "acceptance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fetched_evaluation = json.loads((fetched / host_name / "tiny" / "evaluation.json").read_text())
    assert fetched_evaluation["report"] == trained
    assert summary["evaluation"]["record"] == fetched_evaluation["record"]  # what made the figures, named
    assert json.loads((fetched / host_name / "tiny" / "parity.json").read_text())["ok"]  # the last parity gate
    assert not (checkpoint / "optimizer_state_dict.pt").exists()


def _assert_all_skipped(summary: dict) -> None:
    statuses = {name: info["status"] for name, info in summary["steps"].items()}
    for step in (step.name for step in step_table.STEPS if step.recorded):
        assert statuses[step] == "skipped: unchanged", statuses


def test_pipeline_over_ssh_runs_then_skips_every_step_and_fetches_the_checkpoint(
        cli: Cli, tmp_path: Path, sshd: SshServer) -> None:
    fetched = tmp_path / "fetched"
    cli_env = {"SPECOPS_FETCHED": str(fetched), "SPECOPS_RUNS_DIR": str(_small_runs(tmp_path))}
    before = sshd.logins()
    first = cli("pipeline", "--host", "loop", "--json", timeout=900, **cli_env)
    assert first.exit_code == 0, first.stderr[-4000:]
    assert sshd.logins() - before == 1  # doctor, launch, follow and fetch: one connection
    _assert_first_run(first.json(), fetched, "loop")
    second = cli("pipeline", "--host", "loop", "--json", timeout=900, **cli_env)
    assert second.exit_code == 0, second.stderr[-4000:]
    _assert_all_skipped(second.json())


def _assert_loads_with_speculators(checkpoint: Path) -> None:
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

    config = json.loads((checkpoint / "config.json").read_text())
    aux_layers = len(config["eagle_aux_hidden_state_layer_ids"])
    hidden = config["transformer_layer_config"]["hidden_size"]
    model = Eagle3DraftModel.from_pretrained(str(checkpoint)).float().eval()
    captured: list[torch.Tensor] = []
    model.lm_head.register_forward_hook(lambda _module, _inputs, output: captured.append(output))
    seq = 12
    with torch.no_grad():
        model(hidden_states=torch.randn(1, seq, aux_layers * hidden), input_ids=torch.randint(0, 500, (1, seq)),
              document_ids=torch.zeros(1, seq, dtype=torch.long), ttt_steps=1)
    assert captured and captured[0].shape == (1, seq, config["draft_vocab_size"])


def test_on_local_a_finished_run_skips_and_a_new_vocab_reruns_only_vocab_and_train_and_a_killed_training_resumes(
        cli: Cli, tmp_path: Path, sshd: SshServer, finished: tuple[Path, dict]) -> None:
    # Run configs kept outside the checkout (SPECOPS_RUNS_DIR): the user's edit travels to the host.
    runs = tmp_path / "my-runs"
    runs.mkdir()
    config_file = runs / "tiny.yaml"
    config_file.write_text((REPO / "runs" / "tiny.yaml").read_text())
    fetched = tmp_path / "fetched"
    env = {"SPECOPS_RUNS_DIR": str(runs), "SPECOPS_FETCHED": str(fetched)}
    workdir = copy_of(finished, _workdir(tmp_path, "local"))  # every step done (a copy of it, elsewhere)

    def pipeline() -> dict:
        result = cli("pipeline", "--host", "local", "--json", timeout=900, **env)
        assert result.exit_code == 0, result.stderr[-4000:]
        return result.json()

    before = sshd.logins()
    again = pipeline()
    assert sshd.logins() == before  # the local host is no SSH host
    _assert_all_skipped(again)
    _assert_evaluated_and_fetched(again, fetched, "local")
    _assert_loads_with_speculators(fetched / "local" / "tiny" / "checkpoint")

    config = yaml.safe_load(config_file.read_text())
    config["draft"]["vocab_size"] = 128
    config["train"]["epochs"] = 1  # a new training from scratch: one epoch, then more epochs continue it below
    config_file.write_text(yaml.safe_dump(config))
    changed = pipeline()
    statuses = {name: info["status"] for name, info in changed["steps"].items()}
    assert statuses["regenerate"] == statuses["prepare"] == statuses["extract"] == statuses["validate"] \
        == "skipped: unchanged"
    assert statuses["vocab"] == "done" and statuses["train"] == "done"
    assert changed["coverage"][0]["draft_vocab"] == 128

    # more epochs continue the same training; kill it mid-way and launch again: it resumes
    launched = cli("train", "--host", "local", "--epochs", "3", "--detach", "--json", "--skip-doctor", **env)
    assert launched.exit_code == 0, launched.stderr
    job_id = launched.json()["job"]["id"]
    checkpoints = workdir / "runs" / "tiny" / "checkpoints"
    deadline = time.monotonic() + 300
    while not (checkpoints / "1" / "model.safetensors").exists():
        assert time.monotonic() < deadline, "training never finished epoch 2"
        assert cli("status", "--host", "local", "--json").json()["jobs"][-1]["state"] in ("running", "pending")
        time.sleep(0.5)
    stopped = cli("stop", "--host", "local", "--job", job_id, "--json")
    assert stopped.exit_code == 0 and stopped.json()["job"]["state"] == "stopped"
    resumed = cli("train", "--host", "local", "--epochs", "3", "--json", "--skip-doctor", timeout=900, **env)
    assert resumed.exit_code == 0, resumed.stderr[-4000:]
    result = resumed.json()
    assert result["resume"].startswith("resuming from epoch")
    assert result["checkpoints"]["newest_epoch"] == 2
    assert (checkpoints / "0").exists()  # nothing restarted from scratch into a new folder
