"""`invoke sync` moves only changed files, deletes what we no longer ship, never touches the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import Cli

pytestmark = pytest.mark.ssh


@pytest.mark.parametrize("method", ["rsync", "sftp"])
def test_sync_moves_only_changed_files_and_never_the_excluded_ones(cli: Cli, tmp_path: Path, method: str) -> None:
    flags = ["--sftp"] if method == "sftp" else []
    workdir = tmp_path / "loop-workdir"
    first = cli("sync", "--host", "loop", "--json", *flags)
    assert first.exit_code == 0, first.stderr
    assert first.json()["method"] == method
    assert "src/specops/cli.py" in first.json()["changed"]
    assert (workdir / "state" / "agent.sha256").exists() and (workdir / "state" / "revision.json").exists()
    for never in (".git", ".venv", "logs", "tests", "remote", "tasks.py", "inventory.yaml"):
        assert not (workdir / never).exists(), never

    # the host's own things, and a file we stopped shipping
    (workdir / "runs" / "tiny").mkdir(parents=True)
    (workdir / "runs" / "tiny" / "hs_0.safetensors").write_bytes(b"x" * 10)
    (workdir / "state" / "jobs").mkdir(parents=True)
    (workdir / "state" / "jobs" / "job.json").write_text("{}")
    (workdir / "src" / "specops" / "stale_module.py").write_text("old = True\n")
    (workdir / "src" / "specops" / "cli.py").write_text("# edited on the host\n")

    second = cli("sync", "--host", "loop", "--json", *flags)
    assert second.exit_code == 0, second.stderr
    report = second.json()
    assert report["changed"] == ["src/specops/cli.py"]
    assert report["deleted"] == ["src/specops/stale_module.py"]
    assert (workdir / "src" / "specops" / "cli.py").read_bytes() == Path("src/specops/cli.py").read_bytes()
    assert (workdir / "runs" / "tiny" / "hs_0.safetensors").read_bytes() == b"x" * 10
    assert (workdir / "state" / "jobs" / "job.json").exists()

    third = cli("sync", "--host", "loop", "--json", *flags)
    assert third.json()["changed"] == [] and third.json()["deleted"] == []


def test_dry_run_changes_nothing(cli: Cli, tmp_path: Path) -> None:
    result = cli("sync", "--host", "loop", "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    assert "src/specops/cli.py" in result.json()["changed"]
    assert not (tmp_path / "loop-workdir" / "src").exists()


def test_after_sync_the_agent_call_needs_no_bundle(cli: Cli, tmp_path: Path) -> None:
    assert cli("sync", "--host", "loop").exit_code == 0
    check = cli("check", "--host", "loop", "--json")
    assert check.exit_code == 0 and check.json()["round_trips"] == 1
