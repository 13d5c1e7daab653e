"""Bad input through the real `invoke`, on `local` and over the real sshd: one line, exit 2, nothing written.

A run config is checked on the host through the task's one connection BEFORE anything is launched:
no job, no job record, no prepared data. The line names this checkout's file (not the host's copy),
the key and what is wrong.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.cli import Cli, CliResult
from tests.support.repo import REPO

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def _runs_with(tmp_path: Path, name: str, change) -> dict[str, str]:
    runs = tmp_path / "my-runs"
    runs.mkdir(exist_ok=True)
    config = yaml.safe_load((REPO / "runs" / "tiny.yaml").read_text())
    change(config)
    (runs / f"{name}.yaml").write_text(yaml.safe_dump(config))
    return {"SPECOPS_RUNS_DIR": str(runs)}


def _assert_one_line(result: CliResult, *needles: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("specops:")]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


def _nothing_written(cli: Cli, tmp_path: Path, host_name: str, run: str) -> None:
    jobs = cli("status", "--host", host_name, "--json").json()["jobs"]
    assert jobs == []
    workdir = tmp_path / ("local-workdir" if host_name == "local" else "loop-workdir")
    assert not (workdir / "runs" / run / "prepared").exists()


def test_a_layer_beyond_the_target_is_refused_before_prepare_launches(cli: Cli, tmp_path: Path,
                                                                       host_name: str) -> None:
    env = _runs_with(tmp_path, "deep", lambda config: config.update(layer_ids=[1, 2, 999]))
    result = cli("prepare", "--host", host_name, "--run", "deep", timeout=300, **env)
    _assert_one_line(result, str(tmp_path / "my-runs" / "deep.yaml"), "layer_ids", "999")
    _nothing_written(cli, tmp_path, host_name, "deep")


def test_a_negative_learning_rate_is_refused_by_prepare_and_train_before_any_job(cli: Cli, tmp_path: Path,
                                                                                host_name: str) -> None:
    env = _runs_with(tmp_path, "steep", lambda config: config["train"].update(lr=-0.001))
    for args in (("prepare",), ("train", "--skip-doctor"), ("pipeline", "--skip-doctor"), ("extract",)):
        result = cli(*args, "--host", host_name, "--run", "steep", timeout=300, **env)
        _assert_one_line(result, "my-runs/steep.yaml", "train.lr", "> 0")
    _nothing_written(cli, tmp_path, host_name, "steep")


def test_a_doctor_that_finds_a_failed_check_is_exit_1(cli: Cli, tmp_path: Path) -> None:
    env = _runs_with(tmp_path, "flagged", lambda config: config["train"].update(extra_args=["--no-such-flag"]))
    result = cli("doctor", "--host", "local", "--run", "flagged", timeout=300, **env)
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert "--no-such-flag" in result.stdout


def test_pipeline_checks_its_backend_as_extract_does(cli: Cli) -> None:
    for task in ("extract", "pipeline"):
        result = cli(task, "--host", "local", "--backend", "tpu")
        _assert_one_line(result, "--backend", "'tpu'")


def test_patch_without_an_action_is_one_line_and_exit_2(cli: Cli) -> None:
    result = cli("patch", "--host", "local")
    _assert_one_line(result, "apply", "verify")
    assert "did not receive" not in result.stderr


def test_an_error_in_a_patch_file_names_the_file_here_not_the_hosts_copy(cli: Cli, tmp_path: Path,
                                                                          host_name: str) -> None:
    import shutil

    sets = tmp_path / "my-patches"
    shutil.copytree(REPO / "patches", sets)
    broken = sets / "speculators-0.9.0-cpu" / "01-local-rank-cpu.toml"
    broken.write_text(broken.read_text() + 'count = "twice"\n')
    result = cli("patch", "verify", "--host", host_name, SPECOPS_PATCH_SETS=str(sets))
    assert result.exit_code == 2, (result.stdout, result.stderr)
    said = result.stdout + result.stderr
    assert f"{broken}: not valid TOML" in said
    assert "-workdir/patches" not in said  # the host's copy is not what a person edits
