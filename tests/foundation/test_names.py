"""Host, run, job and patch-set names: one safe pattern (specops.contract.protocol), checked where each is read
(one line, exit 2, nothing written), and every path built from a name kept inside its root."""

from __future__ import annotations

from pathlib import Path

import pytest

from remote.errors import SpecopsError
from remote.names import inside
from tests.support.agent import run_agent
from tests.support.cli import Cli, write_inventory

PYTHON_HOST = {"connection": "local", "python": "/usr/bin/python3"}
BAD_NAMES = ["a;b", "../../escape", "a b", ".hidden", "-x", "x/y", ""]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_an_inventory_host_with_an_unsafe_name_is_refused_and_nothing_is_written(tmp_path: Path, bad: str) -> None:
    logs = tmp_path / "a" / "logs"
    inventory = write_inventory(tmp_path / "inv.yaml", {
        "good": {**PYTHON_HOST, "workdir": str(tmp_path / "good")},
        bad: {**PYTHON_HOST, "workdir": str(tmp_path / "bad")}}, default="good")
    for args in (("hosts",), ("logs", "--host", bad), ("status", "--host", "good")):
        result = Cli(inventory, logs)(*args)
        assert result.exit_code == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert str(inventory) in result.stderr and "hosts: host name" in result.stderr
    assert not logs.exists() and not (tmp_path / "escape").exists()
    assert not (tmp_path / "good").exists() and not (tmp_path / "bad").exists()


def test_a_host_default_run_with_an_unsafe_name_is_refused(tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inv.yaml", {
        "good": {**PYTHON_HOST, "workdir": str(tmp_path / "good"), "run": "../../x"}}, default="good")
    result = Cli(inventory, tmp_path / "logs")("hosts")
    assert result.exit_code == 2 and "hosts.good.run:" in result.stderr and "safe name" in result.stderr


@pytest.mark.ssh
@pytest.mark.parametrize("args", [
    ("run", "--name", "a;b", "--", "true"),
    ("run", "--run", "../../x", "--", "true"),
    ("prepare", "--run", "../../x"),
    ("train", "--run", "x;rm -rf y"),
    ("fetch", "--run", "../../../../tmp/x"),
    ("patch", "verify", "--set", "../x"),
    ("stop", "--job", "../../state/jobs/x"),
])
def test_unsafe_run_job_and_patch_set_names_are_one_line_exit_2_and_nothing_written(
        cli: Cli, host_name: str, tmp_path: Path, args: tuple[str, ...]) -> None:
    fetched = tmp_path / "fetched"
    result = cli(*args[:1], "--host", host_name, *args[1:], SPECOPS_FETCHED=str(fetched))
    assert result.exit_code == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "safe name" in result.stderr or "only letters, digits" in result.stderr, result.stderr
    jobs = tmp_path / f"{host_name}-workdir" / "state" / "jobs"
    assert not jobs.exists() or not [path for path in jobs.iterdir() if path.suffix == ".json"]
    assert not fetched.exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize("args", [
    ("job", "launch", "--name", "../x", "--", "true"),
    ("job", "launch", "--name", "ok", "--run", "a;b", "--", "true"),
    ("step", "prepare", "--run", "../../x"),
    ("patch", "verify", "--set", "../x"),
    ("patch", "new", "--set", "../../x", "--module", "json", "--edited", "/dev/null", "--id", "p", "--reason", "r"),
])
def test_the_agent_checks_the_same_names_itself(tmp_path: Path, args: tuple[str, ...]) -> None:
    code, document, _stderr = run_agent(tmp_path, *args)
    assert code == 2, document
    assert "safe name" in document["error"]
    assert not (tmp_path / "state" / "jobs").exists() or not list((tmp_path / "state" / "jobs").glob("*-*.json"))


def test_a_path_named_by_the_host_stays_inside_its_root(tmp_path: Path) -> None:
    assert inside(tmp_path, "checkpoint/model.safetensors") == tmp_path / "checkpoint" / "model.safetensors"
    for escaping in ("../x", "checkpoint/../../x", "/etc/passwd"):
        with pytest.raises(SpecopsError, match="would leave"):
            inside(tmp_path, escaping)
