"""`invoke train --hosts gpu1,gpu2`: the run's engine on both hosts, entered with the train step alone, over
real SSH, one torchrun group across them.

Two real sshds stand for two hosts, each with its own workdir and the tiny run's inputs; the hosts' python
puts speculators 0.9.0 (the wheel, patched by the CPU patch set) first on its path, the engines meet at a
rendezvous on loopback at the first host and the training at the port after it. Each sshd sets
SPECOPS_SILENT_S for its commands, as a host's profile would: the engines give up on a silent peer after
that many seconds instead of 60. A host cut off mid-training (every process of its engine's job stopped:
its sockets stay open, nothing answers, as across a partition) stops the other host's trainer, and the
task exits 1 with one line naming it; the relaunch gives every host the newest checkpoint and resumes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from specops.pipeline.training.command import STOP_GRACE_S, is_complete
from tests.conftest import ssh_host
from tests.support.agent import Agent, wait_until
from tests.support.cli import INVOKE, REPO, Cli, write_inventory
from tests.support.sshd import SshServer, free_port, start_sshd
from tests.support.tiny_training import TinyHost, build_data

pytestmark = [pytest.mark.slow, pytest.mark.wheels, pytest.mark.ssh]

HOSTS = ("gpu1", "gpu2")
SILENT_S = 20.0  # the hosts' SPECOPS_SILENT_S (the rendezvous' own: 60 s)
SLACK_S = 90.0   # invoke's start-up, the follow's poll and the engine's exit on a loaded 2-core machine; a hang
                 # is gloo's 30 minutes


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SshServer]]:
    started = [start_sshd(tmp_path_factory.mktemp(f"sshd-{name}"), environment={"SPECOPS_SILENT_S": f"{SILENT_S:g}"})
               for name in HOSTS]
    yield started
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory, servers: list[SshServer]) -> Iterator[tuple]:
    from tests.support.wheels import python_with

    root = tmp_path_factory.mktemp("group")
    python = python_with(root, ("speculators", "0.9.0"))
    known_hosts = root / "known_hosts"
    known_hosts.write_text("".join(server.known_hosts_line() for server in servers))
    nodes = {}
    for name in HOSTS:
        node = TinyHost(root / name)
        node.site = root / "site"  # the site python_with made
        build_data(node.workdir / "inputs" / "verifier", node.workdir / "inputs" / "prepared",
                   node.workdir / "inputs" / "hidden_states")
        nodes[name] = node
    nodes["gpu1"].agent("patch", "apply", "--set", "speculators-0.9.0-cpu", "--patches-dir", str(REPO / "patches"))
    hosts = {name: {**ssh_host(server, nodes[name].workdir, known_hosts, python=str(python)), "channel_timeout": 5}
             for name, server in zip(HOSTS, servers, strict=True)}
    cli = Cli(write_inventory(root / "inventory.yaml", hosts, default="gpu1"), root / "logs")
    yield cli, nodes
    for node in nodes.values():
        Agent(node.workdir).clean_up()


def start(run: str) -> list[str]:
    return ["train", "--hosts", ",".join(HOSTS), "--run", run, "--skip-doctor", "--port", str(free_port()), "--json"]


def engine_jobs(node: TinyHost, run: str) -> list[dict]:
    return [job for job in Agent(node.workdir).records_on_disk() if job["name"] == "train" and job["run"] == run]


def test_a_training_across_two_hosts_is_the_engine_on_each_one_group_and_one_host_keeps_the_checkpoint(
        group: tuple) -> None:
    cli, nodes = group
    run_dirs = {name: node.add_run("across", epochs=1) for name, node in nodes.items()}
    result = cli(*start("across"), timeout=900)
    assert result.exit_code == 0, result.stderr[-3000:]
    document = result.json()
    assert document["ok"] is True and document["hosts"] == list(HOSTS)
    assert document["steps"] == {"train": document["steps"]["train"]}  # the train step alone
    assert document["synced"] is None  # nothing trained before: nothing to copy
    assert document["loss_last"] > 0  # the losses of the host whose trainer logged them
    for name, node in nodes.items():  # the engine on each host, node rank I of two
        [job] = engine_jobs(node, "across")
        assert job["state"] == "succeeded" and job["id"] == document["jobs"][name]
        argv = job["argv"]
        assert argv[argv.index("--only") + 1] == "train" and argv[argv.index("--node-rank") + 1] == str(
            HOSTS.index(name))
    assert sum(is_complete(run_dir / "checkpoints" / "0") for run_dir in run_dirs.values()) == 1
    assert is_complete(run_dirs[document["saved_on"]] / "checkpoints" / "0")
    for run_dir in run_dirs.values():
        assert "dp_size=2" in (run_dir / "checkpoints" / "train.log").read_text()


def job_processes(pgid: int) -> set[int]:
    """Every process of a job: its engine's group and the groups its trainers lead (torchrun gives each
    worker a session of its own)."""
    from specops.jobs.processes import job_groups

    groups = job_groups(pgid)
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if int(text[text.rfind(")") + 2:].split()[2]) in groups:
            found.add(int(stat.parent.name))
    return found


def trainers(run_dir: Path) -> list[str]:
    """Command lines of this host's torchrun and trainer processes (both name the run's folders)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(str(run_dir / "checkpoints") in word for word in words):
            found.append(" ".join(words))
    return found


def test_a_host_gone_silent_mid_training_stops_the_others_trainer_naming_it_and_the_relaunch_resumes(
        group: tuple, tmp_path: Path) -> None:
    cli, nodes = group
    run_dirs = {name: node.add_run("cut", epochs=4) for name, node in nodes.items()}
    output = tmp_path / "train.out"
    with output.open("w") as sink:  # the follow streams the job log: never into an unread pipe
        watching = subprocess.Popen([str(INVOKE), *start("cut")], cwd=REPO, env=cli.env(), stdout=sink,
                                    stderr=subprocess.STDOUT, text=True)
    stopped: set[int] = set()
    try:
        wait_until(lambda: watching.poll() is not None or any(
            is_complete(run_dir / "checkpoints" / "0") for run_dir in run_dirs.values()), timeout_s=600,
            what="the group's first checkpoint")
        assert watching.poll() is None, output.read_text()[-3000:]
        [cut_job] = engine_jobs(nodes["gpu2"], "cut")
        stopped = job_processes(cut_job["pgid"])
        for pid in stopped:  # gpu2 goes silent: its engine, torchrun and trainer stop, their sockets stay open
            os.kill(pid, signal.SIGSTOP)
        cut = time.monotonic()
        watching.wait(timeout=SILENT_S + STOP_GRACE_S + SLACK_S + 300)
        reported_after = time.monotonic() - cut
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if watching.poll() is None:
            watching.kill()
            watching.wait()
    said = output.read_text()
    assert watching.returncode == 1, said[-3000:]
    last = said.strip().splitlines()[-1]
    assert "train across gpu1, gpu2: job " in last and " on gpu1 failed: gpu2: its engine has not been heard for " \
        in last and "(killed, its host down or cut off); specops stopped this host's trainer" in last, last
    print(f"gpu2 silent → the task's one line {reported_after:.1f} s later (SPECOPS_SILENT_S {SILENT_S:g})")
    assert reported_after < SILENT_S + STOP_GRACE_S + SLACK_S
    [kept_job] = engine_jobs(nodes["gpu1"], "cut")
    assert kept_job["state"] == "failed"
    assert trainers(run_dirs["gpu1"]) == []  # the stop reached torchrun's trainer too

    # the cut host's processes killed: gone (reaped), and its engine's job recorded ended
    wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in stopped) and engine_jobs(
        nodes["gpu2"], "cut")[0]["state"] not in ("pending", "running"), timeout_s=120, what="gpu2's job to end")
    again = cli(*start("cut"), timeout=900)
    assert again.exit_code == 0, again.stderr[-3000:]
    document = again.json()
    assert document["synced"]["epoch"] is not None and document["synced"]["copied_to"]  # gathered first
    logs = [(run_dir / "checkpoints" / "train.log").read_text().split("### specops launch")[-1]
            for run_dir in run_dirs.values()]
    assert not any("Starting fresh" in log for log in logs) and sum("Resuming" in log for log in logs) == 1
    assert any(is_complete(run_dir / "checkpoints" / "3") for run_dir in run_dirs.values())
