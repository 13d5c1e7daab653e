"""A training across two hosts survives a partition: the cut ends the run clearly, the relaunch resumes.

Two hosts, each a network namespace with its own address, its own sshd and a route to the other; the
inventory names each host's training address (and gpu2's interface), so the engines' rendezvous,
torchrun's c10d rendezvous and gloo's collectives run between the namespaces, as between two machines.
`invoke train --hosts gpu1,gpu2` trains the tiny draft there (the engine on each host, entered with the
train step); once both nodes train and the first checkpoint is written, nftables drops every packet of
gpu2. gpu1's engine stops its trainer once gpu2 is silent for SILENT_S (the hosts' python sets
SPECOPS_SILENT_S, as a host's profile would) and the task exits 1 naming gpu2; after healing, gpu2's
engine ends by itself (its rendezvous is gone), the relaunch resumes from the checkpoint written before
the cut and finishes every epoch, and no process of the first launch is left on either host.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from specops.pipeline.training.command import STOP_GRACE_S, is_complete
from tests.support.agent import Agent, group_alive, wait_until
from tests.support.cli import INVOKE, REPO, Cli, write_inventory
from tests.support.netns import NetnsHost, NetnsUnavailable, netns_hosts
from tests.support.sshd import free_port
from tests.support.tiny_training import TinyHost, build_data

pytestmark = [pytest.mark.slow, pytest.mark.wheels, pytest.mark.ssh]

HOSTS = ("gpu1", "gpu2")
CUT, KEPT = "gpu2", "gpu1"  # gpu1 hosts the rendezvous; cutting it instead behaves the same (measured)
RUN = "split"
EPOCHS = 4
CONNECT_TIMEOUT = 3.0
CHANNEL_TIMEOUT = 5.0
SILENT_S = 20.0  # the hosts' SPECOPS_SILENT_S (the rendezvous' own: 60 s)
SLACK_S = 90.0  # invoke's start-up, the follow's poll and the engine's exit on a loaded 2-core machine; a hang is
                # gloo's 30 minutes
def interface_in(host: NetnsHost) -> str:
    """The name of the namespace's own end of its veth pair (the interface holding its address)."""
    listed = subprocess.run(["ip", "netns", "exec", host.namespace, "ip", "-o", "-4", "addr", "show"],
                            capture_output=True, text=True, check=True).stdout
    return next(line.split()[1] for line in listed.splitlines() if f" {host.address}/" in line)


@pytest.fixture(scope="module")
def routed_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NetnsHost]]:
    try:
        hosts = netns_hosts(lambda tag: tmp_path_factory.mktemp(f"netns-{tag}"), ("a", "b"), routed=True)
    except NetnsUnavailable as exc:
        pytest.skip(f"network namespaces unavailable: {exc}")
    yield hosts
    for host in hosts:
        host.destroy()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, routed_hosts: list[NetnsHost]) -> Iterator[tuple]:
    from tests.support.repo import REPO
    from tests.support.wheels import python_with

    root = tmp_path_factory.mktemp("partition-training")
    site_python = python_with(root, ("speculators", "0.9.0"))
    python = root / "silent-python"  # the host env, with the engines' silence shortened
    python.write_text(f"#!/bin/sh\nSPECOPS_SILENT_S={SILENT_S:g} exec '{site_python}' \"$@\"\n")
    python.chmod(0o755)
    known_hosts = root / "known_hosts"
    known_hosts.write_text("".join(host.server.known_hosts_line() for host in routed_hosts if host.server))
    nodes, hosts = {}, {}
    for name, network in zip(HOSTS, routed_hosts, strict=True):
        assert network.server is not None
        node = TinyHost(root / name)
        node.site = root / "site"  # the site python_with made
        build_data(node.workdir / "inputs" / "verifier", node.workdir / "inputs" / "prepared",
                   node.workdir / "inputs" / "hidden_states")
        nodes[name] = node
        hosts[name] = {"address": network.address, "port": network.port, "user": network.server.user,
                       "identity_file": str(network.server.client_key), "known_hosts": str(known_hosts),
                       "workdir": str(node.workdir), "python": str(python), "connect_timeout": CONNECT_TIMEOUT,
                       "channel_timeout": CHANNEL_TIMEOUT, "train_address": network.address}
    # gpu1's node finds its interface from its address on the host; gpu2's is named, as a user may
    hosts["gpu2"]["train_interface"] = interface_in(routed_hosts[1])
    nodes["gpu1"].agent("patch", "apply", "--set", "speculators-0.9.0-cpu", "--patches-dir", str(REPO / "patches"))
    cli = Cli(write_inventory(root / "inventory.yaml", hosts, default="gpu1"), root / "logs")
    yield cli, nodes, dict(zip(HOSTS, routed_hosts, strict=True))
    for network in routed_hosts:
        network.heal()
    for node in nodes.values():
        Agent(node.workdir).clean_up()


def train_on_hosts() -> list[str]:
    return ["train", "--hosts", ",".join(HOSTS), "--run", RUN, "--skip-doctor", "--port", str(free_port()), "--json"]


def node_processes(run_dir: Path) -> list[str]:
    """Command lines of this host's torchrun and trainer processes (both name the run's folders)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:  # ended while we looked
            continue
        if any(str(run_dir) in word for word in words):
            found.append(" ".join(words))
    return found


def newest_training_state(run_dirs: dict[str, Path]) -> dict:
    """training_state.json of the newest complete numbered checkpoint on any host (only rank 0 saves)."""
    complete = [folder for run_dir in run_dirs.values() for folder in (run_dir / "checkpoints").iterdir()
                if folder.name.isdigit() and is_complete(folder)]
    assert complete, "no complete checkpoint on either host"
    return json.loads(max(complete, key=lambda folder: int(folder.name)).joinpath("training_state.json").read_text())


def resume_line(state: dict) -> str:
    """What speculators' trainer logs when it resumes from that state."""
    if state.get("local_step", 0) > 0:
        return f"Resuming mid-epoch from epoch={state['epoch']} local_step={state['local_step']} "
    return f"Resuming training on epoch {state['epoch'] + 1}."


def launch_log(run_dir: Path) -> str:
    """The newest launch's part of the host's train.log."""
    return (run_dir / "checkpoints" / "train.log").read_text().split("### specops launch")[-1]


def test_a_partitioned_node_ends_the_run_clearly_and_the_relaunch_after_healing_resumes(cluster: tuple) -> None:
    cli, nodes, networks = cluster
    run_dirs = {name: node.add_run(RUN, epochs=EPOCHS) for name, node in nodes.items()}
    for node in nodes.values():
        node.agent("step", "vocab", "--run", RUN)
    output = cli.logs.parent / "train.out"
    with output.open("w") as sink:  # the follow streams the job log: never into an unread pipe
        watching = subprocess.Popen([str(INVOKE), *train_on_hosts()], cwd=REPO, env=cli.env(),
                                    stdout=subprocess.PIPE, stderr=sink, text=True)

    def training_on_both() -> bool:
        logs = [run_dir / "checkpoints" / "train.log" for run_dir in run_dirs.values()]
        return (all(log.exists() and "dp_size=2" in log.read_text() for log in logs)
                and any(is_complete(run_dir / "checkpoints" / "0") for run_dir in run_dirs.values()))

    try:
        wait_until(lambda: training_on_both() or watching.poll() is not None, timeout_s=600,
                   what="both nodes to train and the first checkpoint to be written")
        assert watching.poll() is None, watching.communicate()[1][-3000:]
        networks[CUT].partition()
        cut = time.monotonic()
        stdout, _stderr = watching.communicate(timeout=SILENT_S + STOP_GRACE_S + SLACK_S + 300)
        reported_after = time.monotonic() - cut
        written_before_heal = newest_training_state(run_dirs)
    finally:
        networks[CUT].heal()
        if watching.poll() is None:
            watching.kill()
            watching.wait()
    healed = time.monotonic()

    stderr = output.read_text()
    assert watching.returncode == 1, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("specops: train across gpu1, gpu2: job ") and f" on {KEPT} failed: {CUT}: " in last, last
    assert "specops stopped this host's trainer" in last, last
    cut_run = json.loads(stdout)
    assert cut_run["ok"] is False and f" failed: {CUT}: " in cut_run["error"]
    assert reported_after < SILENT_S + STOP_GRACE_S + SLACK_S
    first_jobs = {name: job["id"] for name, node in nodes.items() for job in Agent(node.workdir).records_on_disk()
                  if job["name"] == "train" and job["run"] == RUN}
    kept_job = Agent(nodes[KEPT].workdir).show(first_jobs[KEPT])
    assert kept_job["state"] == "failed" and not group_alive(kept_job["pgid"])
    assert node_processes(run_dirs[KEPT]) == []  # the engine's stop reached torchrun's trainer too
    # healed, the cut host's engine finds its rendezvous gone and ends by itself, trainer and all
    wait_until(lambda: Agent(nodes[CUT].workdir).show(first_jobs[CUT])["state"] not in ("pending", "running"),
               timeout_s=420, what=f"{CUT}'s engine to end once healed")

    again = cli(*train_on_hosts(), timeout=900)
    relaunch_s = time.monotonic() - healed
    assert again.exit_code == 0, again.stderr[-3000:]
    document = again.json()
    assert document["ok"] is True and document["hosts"] == list(HOSTS)
    for name, node in nodes.items():
        assert Agent(node.workdir).show(document["jobs"][name])["state"] == "succeeded"
    assert document["synced"]["epoch"] == written_before_heal["epoch"]
    for name, node in nodes.items():
        old = Agent(node.workdir).show(first_jobs[name])
        assert old["state"] not in ("pending", "running") and not group_alive(old["pgid"]), (name, old)
    assert [node_processes(run_dir) for run_dir in run_dirs.values()] == [[], []]
    logs = [launch_log(run_dir) for run_dir in run_dirs.values()]
    assert not any("Starting fresh" in log for log in logs) and sum("Resuming" in log for log in logs) == 1
    assert any(resume_line(written_before_heal) in log for log in logs), resume_line(written_before_heal)
    assert any(is_complete(run_dir / "checkpoints" / str(EPOCHS - 1)) for run_dir in run_dirs.values())
    print(f"cut → report {reported_after:.1f} s (SPECOPS_SILENT_S {SILENT_S:g} s; stopping {KEPT}'s trainer "
          f"included); relaunch "
          f"{relaunch_s:.1f} s from epoch {written_before_heal['epoch']} step {written_before_heal.get('local_step')} "
          f"to epoch {EPOCHS - 1}")
