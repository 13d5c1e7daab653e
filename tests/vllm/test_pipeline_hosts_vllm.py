"""`invoke pipeline --hosts gpu1,gpu2 --backend vllm`: the engine on two loopback hosts, a vLLM server
each (the serve env, .venv-vllm), speculators' own `--rank I --world-size 2` shares, one training over
both, and a checkpoint fetched home. As cheap as it can be: 8 rows, one epoch, the answers the dataset
has, evaluated with hf on 2 held-out prompts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import ssh_host
from tests.foundation.test_many_hosts import second_sshd  # noqa: F401  (a fixture: the second host's sshd)
from tests.support.agent import Agent
from tests.support.cli import Cli, write_inventory
from tests.support.repo import REPO
from tests.support.sshd import SshServer, free_port, two_free_ports
from tests.vllm.conftest import VLLM_PYTHON, in_vllm_worker, needs_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.ssh, pytest.mark.slow, needs_vllm, in_vllm_worker]

RUN = "served"
SAMPLES = 8


def test_the_vllm_backend_across_two_hosts_ends_with_a_fetched_checkpoint(
        patched_vllm: dict, tmp_path: Path, sshd: SshServer, second_sshd: SshServer) -> None:  # noqa: F811
    from tests.e2e.test_pipeline_cli import _assert_loads_with_speculators

    runs = tmp_path / "runs"
    runs.mkdir()
    config = yaml.safe_load((REPO / "runs" / "tiny.yaml").read_text())
    config.update(samples=SAMPLES)  # the backend from --backend (the doctor judges a run's own backend in the
    # default env, which has no vLLM here; the serve env is .venv-vllm)
    config["train"]["epochs"] = 1
    config["regenerate"]["enabled"] = False
    config["evaluate"].update(heldout_prompts=2, max_tokens=8, backend="hf")
    config.setdefault("vllm", {})["port"] = two_free_ports()
    (runs / f"{RUN}.yaml").write_text(yaml.safe_dump(config))
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(sshd.known_hosts_line() + second_sshd.known_hosts_line())
    workdirs = {name: tmp_path / f"{name}-workdir" for name in ("gpu1", "gpu2")}
    hosts = {name: ssh_host(server, workdirs[name], known_hosts, envs={"serve": str(VLLM_PYTHON)})
             for name, server in (("gpu1", sshd), ("gpu2", second_sshd))}
    cli = Cli(write_inventory(tmp_path / "inventory.yaml", hosts, default="gpu1"), tmp_path / "logs")
    try:
        result = cli("pipeline", "--run", RUN, "--hosts", "gpu1,gpu2", "--backend", "vllm", "--port",
                     str(free_port()), "--json", timeout=2400, SPECOPS_RUNS_DIR=str(runs),
                     SPECOPS_FETCHED=str(tmp_path / "fetched"))
        assert result.exit_code == 0, result.stdout[-6000:] + result.stderr[-6000:]
        summary = result.json()
        assert summary["ok"] is True and summary["backend"] == "vllm" and summary["samples"] == SAMPLES
        shares = summary["extract"]["shares"]
        rows = [{row for start, stop in shares[host]["spans"] for row in range(start, stop)} for host in shares]
        assert not rows[0] & rows[1] and rows[0] | rows[1] == set(range(SAMPLES))  # speculators' rank shares
        for name, workdir in workdirs.items():  # every host ends with every file
            assert len(list((workdir / "runs" / RUN / "hidden_states").glob("hs_*.safetensors"))) == SAMPLES, name
        servers = {name: [record for record in Agent(workdir).records_on_disk() if record["name"] == "vllm-server"]
                   for name, workdir in workdirs.items()}
        # an extraction server on each host; --backend vllm now reaches the parity gate, whose served check
        # loads one more server on the first host
        assert all(len(found) >= 1 for found in servers.values()) and sum(map(len, servers.values())) <= 3
        _assert_loads_with_speculators(tmp_path / "fetched" / summary["saved_on"] / RUN / "checkpoint")
    finally:
        for workdir in workdirs.values():
            Agent(workdir).clean_up()  # the servers the extraction kept for the next run
