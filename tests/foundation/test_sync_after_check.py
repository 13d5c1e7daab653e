"""The first `invoke sync` after `invoke check` (which installed the agent) reports nothing changed:
the host already has every file, so none is counted (an mtime-only touch-up is not a change)."""

from __future__ import annotations

import pytest

from tests.support.cli import Cli

pytestmark = pytest.mark.ssh


@pytest.mark.parametrize("method", ["rsync", "sftp"])
def test_the_first_sync_after_check_changes_nothing(cli: Cli, host_name: str, method: str) -> None:
    if host_name == "local" and method == "sftp":
        pytest.skip("a local host has no SFTP")
    checked = cli("check", "--host", host_name)
    assert checked.exit_code == 0, checked.stderr
    flags = ["--sftp"] if method == "sftp" else []
    synced = cli("sync", "--host", host_name, "--json", *flags)
    assert synced.exit_code == 0, synced.stderr
    assert synced.json()["changed"] == [] and synced.json()["deleted"] == []
    human = cli("sync", "--host", host_name, *flags)
    assert f"{host_name}: 0 file(s) changed, 0 deleted" in human.stdout
