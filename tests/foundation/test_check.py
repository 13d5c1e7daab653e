"""`invoke check` reports the host in one round trip, locally and over a real sshd."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import Cli


@pytest.mark.ssh
def test_check_reports_versions_and_tools_as_json(cli: Cli, host_name: str) -> None:
    result = cli("check", "--host", host_name, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["host"] == host_name
    default_env = report["envs"]["default"]
    assert default_env["python_version"].startswith("3.")
    assert default_env["packages"]["torch"] and default_env["packages"]["transformers"]
    assert report["tools"]["tmux"] and report["workdir_writable"] is True
    assert report["disk_free_bytes"] > 0
    assert report["round_trips"] == 1


@pytest.mark.ssh
def test_check_installs_the_agent_once_then_reuses_it(cli: Cli, inventory, tmp_path) -> None:
    first = cli("check", "--host", "loop", "--json")
    assert first.exit_code == 0, first.stderr
    digest = (tmp_path / "loop-workdir" / "state" / "agent.sha256").read_text()
    assert (tmp_path / "loop-workdir" / "src" / "specops" / "cli.py").exists()
    second = cli("check", "--host", "loop", "--json")
    assert second.exit_code == 0 and second.json()["round_trips"] == 1
    assert (tmp_path / "loop-workdir" / "state" / "agent.sha256").read_text() == digest


@pytest.mark.ssh
def test_a_host_whose_agent_was_changed_behind_our_back_is_brought_current(cli: Cli, tmp_path) -> None:
    assert cli("check", "--host", "loop", "--json").exit_code == 0
    (tmp_path / "loop-workdir" / "state" / "agent.sha256").write_text("someone-else")
    result = cli("check", "--host", "loop", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["round_trips"] == 2  # refused as stale, then installed and run


def test_human_output_is_a_table_with_a_verdict(cli: Cli) -> None:
    result = cli("check", "--host", "local")
    assert result.exit_code == 0, result.stderr
    assert "transformers" in result.stdout and "OK in" in result.stdout


def test_a_missing_python_env_is_a_failed_check(cli: Cli, tmp_path, inventory) -> None:
    text = inventory.read_text().replace("connection: local", "connection: local\n    envs: {serve: /nowhere/python}")
    inventory.write_text(text)
    result = cli("check", "--host", "local", "--json")
    assert result.exit_code == 1
    report = result.json()
    assert report["envs"]["serve"]["ok"] is False
    assert any("env serve" in problem for problem in report["problems"])


def test_list_shows_the_tasks(cli: Cli) -> None:
    result = cli("--list")
    assert result.exit_code == 0
    for name in ("check", "hosts"):
        assert name in result.stdout


def test_hosts_lists_the_inventory(cli: Cli) -> None:
    result = cli("hosts", "--json")
    assert result.exit_code == 0
    document = result.json()
    assert document["default"] == "local"
    assert {host["name"] for host in document["hosts"]} == {"local", "loop"}


@pytest.mark.ssh
def test_a_host_whose_digest_file_vanished_is_brought_current(cli: Cli, tmp_path) -> None:
    assert cli("check", "--host", "loop", "--json").exit_code == 0
    (tmp_path / "loop-workdir" / "state" / "agent.sha256").unlink()
    result = cli("check", "--host", "loop", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["round_trips"] == 2  # no digest is a stale host, not a current one


@pytest.mark.ssh
def test_a_workdir_that_cannot_be_made_is_one_line_naming_the_inventory_key(cli: Cli, host_name: str,
                                                                            tmp_path) -> None:
    blocker = tmp_path / f"{host_name}-workdir"  # the inventory's workdir, made a file: no folder below it
    blocker.write_text("not a folder")
    result = cli("check", "--host", host_name)
    assert result.exit_code == 1
    assert f"hosts.{host_name}.workdir" in result.stderr and "cannot create or enter workdir" in result.stderr
