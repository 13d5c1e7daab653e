"""Training over two hosts for real: two agents, each `step train --nnodes 2 --node-rank I`, meet at a
c10d rendezvous and train the tiny draft as one torchrun group over gloo on the CPU.

The two "hosts" are two workdirs on this machine (their own run folders and save paths) reaching the
rendezvous on loopback; speculators 0.9.0 comes from the wheel, patched by the CPU patch set (which
gives it a gloo process group without an accelerator).

What happens when a node dies is the control side's business, tested through SSH in
test_train_group.py: torchrun alone does not end the survivor reliably (measured here: once 20 s
after its peer's SIGKILL, once still waiting after 300 s, at its exit barrier / rendezvous).
"""

from __future__ import annotations

import subprocess

import pytest

from specops.pipeline.training.command import is_complete
from tests.support.sshd import free_port
from tests.support.tiny_training import TinyHost, build_data

pytestmark = [pytest.mark.slow, pytest.mark.wheels]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> list[TinyHost]:
    from tests.support.repo import REPO
    from tests.support.wheels import site_with

    root = tmp_path_factory.mktemp("two-nodes")
    site = site_with(root / "site", ("speculators", "0.9.0"))
    hosts = []
    for name in ("node0", "node1"):
        host = TinyHost(root / name)
        host.site = site
        build_data(host.workdir / "inputs" / "verifier", host.workdir / "inputs" / "prepared",
                   host.workdir / "inputs" / "hidden_states")
        hosts.append(host)
    hosts[0].agent("patch", "apply", "--set", "speculators-0.9.0-cpu", "--patches-dir", str(REPO / "patches"))
    return hosts


def launch_group(nodes: list[TinyHost], run: str, rdzv_id: str) -> list[subprocess.Popen]:
    endpoint = f"127.0.0.1:{free_port()}"
    return [node.start_agent("step", "train", "--run", run, "--nnodes", str(len(nodes)), "--node-rank", str(rank),
                             "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id)
            for rank, node in enumerate(nodes)]


def test_two_nodes_train_the_tiny_draft_as_one_gloo_group(nodes: list[TinyHost]) -> None:
    run_dirs = [node.add_run("group", epochs=1) for node in nodes]
    for node in nodes:
        assert node.agent("step", "vocab", "--run", "group")["status"] == "done"
    group = launch_group(nodes, "group", "group-1")
    codes = [process.wait(timeout=600) for process in group]
    logs = [(run_dir / "checkpoints" / "train.log").read_text() for run_dir in run_dirs]
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    for log in logs:
        assert "--nnodes=2" in log and "--rdzv-backend=c10d" in log
        assert "dp_size=2" in log  # one data-parallel group over both hosts
    # c10d hands out ranks itself (node_rank is ignored), and only global rank 0 saves: exactly one
    # of the two hosts holds the checkpoint, and that is the one the control side fetches from
    saved = [index for index, run_dir in enumerate(run_dirs) if is_complete(run_dir / "checkpoints" / "0")]
    assert len(saved) == 1
    report = nodes[saved[0]].agent("step", "metrics", "--run", "group")
    assert report["epochs"] and report["epochs"][0]["train"]["loss"] > 0
    assert report["checkpoints"]["newest_epoch"] == 0
