"""`invoke sync`'s rsync shares one OpenSSH master between syncs (ControlMaster/ControlPersist):
a repeated sync makes no new SSH login, yet host keys stay verified against the inventory's
known_hosts, and run configs kept elsewhere still travel as the bundle lays them out."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.cli import Cli
from tests.support.sshd import SshServer

pytestmark = pytest.mark.ssh


def test_a_second_sync_reuses_the_first_ones_ssh_login(cli: Cli, sshd: SshServer, control_dir: Path) -> None:
    before = sshd.logins()
    first = cli("sync", "--host", "loop", "--json", SPECOPS_SSH_CONTROL_DIR=str(control_dir))
    assert first.exit_code == 0, first.stderr
    assert sshd.logins() == before + 1
    assert len(list(control_dir.iterdir())) == 1  # the master's socket
    second = cli("sync", "--host", "loop", "--json", SPECOPS_SSH_CONTROL_DIR=str(control_dir))
    assert second.exit_code == 0, second.stderr
    assert second.json()["changed"] == []
    assert sshd.logins() == before + 1


def test_without_sharing_every_sync_logs_in(cli: Cli, sshd: SshServer, control_dir: Path) -> None:
    before = sshd.logins()
    for _ in range(2):
        result = cli("sync", "--host", "loop", SPECOPS_SSH_CONTROL_DIR=str(control_dir), SPECOPS_SSH_PERSIST="0")
        assert result.exit_code == 0, result.stderr
    assert sshd.logins() == before + 2
    assert list(control_dir.iterdir()) == []


def test_a_folder_others_can_enter_is_not_used_for_sockets(cli: Cli, sshd: SshServer, control_dir: Path) -> None:
    control_dir.chmod(0o755)
    before = sshd.logins()
    for _ in range(2):
        assert cli("sync", "--host", "loop", SPECOPS_SSH_CONTROL_DIR=str(control_dir)).exit_code == 0
    assert sshd.logins() == before + 2 and list(control_dir.iterdir()) == []


def test_a_changed_host_key_is_refused_even_while_a_master_is_up(cli: Cli, control_dir: Path, known_hosts: Path,
                                                                  tmp_path: Path) -> None:
    assert cli("sync", "--host", "loop", SPECOPS_SSH_CONTROL_DIR=str(control_dir)).exit_code == 0
    # known_hosts now says the host has another key (as after a man-in-the-middle or a reinstall)
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    address = known_hosts.read_text().split()[0]
    key_type, key = other.with_suffix(".pub").read_text().split()[:2]
    known_hosts.write_text(f"{address} {key_type} {key}\n")
    refused = cli("sync", "--host", "loop", SPECOPS_SSH_CONTROL_DIR=str(control_dir))
    assert refused.exit_code == 1
    assert "host key" in refused.stderr


def test_run_configs_kept_elsewhere_travel_and_the_host_is_current(cli: Cli, tmp_path: Path,
                                                                   control_dir: Path) -> None:
    runs = tmp_path / "my-runs"
    runs.mkdir()
    (runs / "mine.yaml").write_text(Path("runs/tiny.yaml").read_text())
    env = {"SPECOPS_RUNS_DIR": str(runs), "SPECOPS_SSH_CONTROL_DIR": str(control_dir)}
    synced = cli("sync", "--host", "loop", "--json", **env)
    assert synced.exit_code == 0, synced.stderr
    host_runs = tmp_path / "loop-workdir" / "runs"
    assert sorted(path.name for path in host_runs.glob("*.yaml")) == ["mine.yaml"]
    check = cli("check", "--host", "loop", "--json", **env)
    assert check.exit_code == 0 and check.json()["round_trips"] == 1  # the digest rsync sent is the bundle's


def test_the_host_gets_exactly_the_bundles_files(cli: Cli, tmp_path: Path, control_dir: Path) -> None:
    # rsync reads the checkout itself through its filters: what lands must be what the digest covers
    from remote.bundle import bundle_files

    assert cli("sync", "--host", "loop", SPECOPS_SSH_CONTROL_DIR=str(control_dir)).exit_code == 0
    workdir = tmp_path / "loop-workdir"
    landed = {path.relative_to(workdir).as_posix() for path in workdir.rglob("*")
              if path.is_file() and path.relative_to(workdir).parts[0] != "state"}
    assert landed == set(bundle_files())
