"""`invoke train --hosts gpu1,gpu2`: one torchrun node job per host over real SSH, watched as one group.

Two real sshds stand for two hosts, each with its own workdir and the tiny run's inputs; the hosts'
python puts speculators 0.9.0 (the wheel, patched by the CPU patch set) first on its path, and the
rendezvous is on loopback at the first host. A node killed in the middle stops the whole group and
names the host; the relaunch copies the newest checkpoint to the host without it and resumes.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from specops.pipeline.training.command import is_complete
from tests.conftest import ssh_host
from tests.support.agent import Agent
from tests.support.cli import Cli, write_inventory
from tests.support.sshd import SshServer, free_port, start_sshd
from tests.support.tiny_training import TinyHost, build_data

pytestmark = [pytest.mark.slow, pytest.mark.wheels, pytest.mark.ssh]

HOSTS = ("gpu1", "gpu2")
@pytest.fixture(scope="module")
def second_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    server = start_sshd(tmp_path_factory.mktemp("sshd-2"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory, sshd: SshServer, second_sshd: SshServer) -> Iterator[tuple]:
    from tests.support.repo import REPO
    from tests.support.wheels import python_with

    root = tmp_path_factory.mktemp("group")
    python = python_with(root, ("speculators", "0.9.0"))
    known_hosts = root / "known_hosts"
    known_hosts.write_text(sshd.known_hosts_line() + second_sshd.known_hosts_line())
    nodes = {}
    for name, _server in zip(HOSTS, (sshd, second_sshd), strict=True):
        node = TinyHost(root / name)
        node.site = root / "site"  # the site python_with made
        build_data(node.workdir / "inputs" / "verifier", node.workdir / "inputs" / "prepared",
                   node.workdir / "inputs" / "hidden_states")
        nodes[name] = node
    nodes["gpu1"].agent("patch", "apply", "--set", "speculators-0.9.0-cpu", "--patches-dir", str(REPO / "patches"))
    hosts = {name: {**ssh_host(server, nodes[name].workdir, known_hosts, python=str(python)), "channel_timeout": 5}
             for name, server in zip(HOSTS, (sshd, second_sshd), strict=True)}
    cli = Cli(write_inventory(root / "inventory.yaml", hosts, default="gpu1"), root / "logs")
    yield cli, nodes
    for node in nodes.values():
        Agent(node.workdir).clean_up()


def start(cli: Cli, run: str) -> list[str]:
    return ["train", "--hosts", ",".join(HOSTS), "--run", run, "--skip-doctor", "--port", str(free_port()), "--json"]


def test_a_training_across_two_hosts_is_one_group_and_one_host_keeps_the_checkpoint(group: tuple) -> None:
    cli, nodes = group
    run_dirs = {name: node.add_run("across", epochs=1) for name, node in nodes.items()}
    for node in nodes.values():
        node.agent("step", "vocab", "--run", "across")
    result = cli(*start(cli, "across"), timeout=900)
    assert result.exit_code == 0, result.stderr[-3000:]
    document = result.json()
    assert document["ok"] is True and document["states"] == {"gpu1": "succeeded", "gpu2": "succeeded"}
    assert document["synced"] == {"epoch": None, "copied_to": []}  # nothing trained before
    assert sum(is_complete(run_dir / "checkpoints" / "0") for run_dir in run_dirs.values()) == 1
    for run_dir in run_dirs.values():
        assert "dp_size=2" in (run_dir / "checkpoints" / "train.log").read_text()


def test_a_node_killed_mid_training_stops_the_group_and_the_relaunch_resumes(group: tuple) -> None:
    cli, nodes = group
    run_dirs = {name: node.add_run("cut", epochs=6) for name, node in nodes.items()}
    for node in nodes.values():
        node.agent("step", "vocab", "--run", "cut")
    watching = cli.popen(*start(cli, "cut"))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not any(
            (run_dir / "checkpoints" / "0" / "training_state.json").exists() for run_dir in run_dirs.values()):
        time.sleep(0.1)
    record = Agent(nodes["gpu2"].workdir).show("train")
    os.killpg(record["pgid"], signal.SIGKILL)  # gpu2's node dies: its job wrapper, torchrun and trainer
    killed = time.monotonic()
    _stdout, stderr = watching.communicate(timeout=300)
    reported_after = time.monotonic() - killed
    assert watching.returncode == 1, stderr[-3000:]
    assert "train across gpu1, gpu2: gpu2:" in stderr and "stopped the group" in stderr
    print(f"group stopped and reported {reported_after:.1f} s after gpu2 died")
    assert Agent(nodes["gpu1"].workdir).show("train")["state"] in ("stopped", "failed")

    again = cli(*start(cli, "cut"), timeout=900)
    assert again.exit_code == 0, again.stderr[-3000:]
    document = again.json()
    assert document["synced"]["epoch"] is not None and document["synced"]["copied_to"]  # gathered first
    logs = [(run_dir / "checkpoints" / "train.log").read_text().split("### specops launch")[-1]
            for run_dir in run_dirs.values()]
    assert not any("Starting fresh" in log for log in logs) and sum("Resuming" in log for log in logs) == 1
    assert any(is_complete(run_dir / "checkpoints" / "5") for run_dir in run_dirs.values())
