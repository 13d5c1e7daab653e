"""A server another run kept for the next run on the target (vllm.keep_server) is the next run's: it uses it
when it fits, and stops it when it needs the port or the GPUs (vllm/handover.py); a server whose run still
owns it is refused at launch when the run would need its port later, not hours later at that step.

The server here is a real process on a real port, launched as a `vllm-server` job of run tiny in another
workdir with the signature a vLLM server of that run records (plus meta.keep when kept): what is under test
is who may use, stop or refuse it, which reads the job records, the port's owner and the lease, not what the
server answers. No vLLM is needed (test_reuse.py does the same with the real server).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.agent import Agent, run_agent, wait_until
from tests.support.cli import Cli, write_inventory
from tests.support.runs import edit_run
from tests.support.sshd import free_port
from tests.support.vllm import tiny_workdir

pytestmark = [pytest.mark.slow]

ENV = {"SPECOPS_SERVE_PYTHON": sys.executable}  # the serve env's path is part of a server's signature


@dataclass
class Held:
    port: int
    owner: Path   # the workdir whose run tiny left the server up
    next: Path    # another workdir with the same tiny target on the same port
    job: str


def _signature(workdir: Path, *, layer_ids: list[int] | None = None,
               serve_python: str = ENV["SPECOPS_SERVE_PYTHON"]) -> dict:
    """What a capturing vLLM server of run tiny in `workdir`, started from `serve_python`'s env, records
    (ports.run_wide, with its layer ids)."""
    from specops.pipeline.run import Run
    from specops.pipeline.vllm import serving_from
    from specops.pipeline.vllm.ports import run_wide

    with serving_from(serve_python):
        values = run_wide(Run("tiny", workdir), captures=True)
    return {**values, "layer_ids": layer_ids if layer_ids is not None else values["layer_ids"]}


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, Path]:
    port = free_port()
    root = tmp_path_factory.mktemp("handover")
    return port, tiny_workdir(root / "owner", port), tiny_workdir(root / "next", port)


def _serve(workdirs: tuple[int, Path, Path], *, kept: bool, layer_ids: list[int] | None = None,
           serve_python: str = ENV["SPECOPS_SERVE_PYTHON"]) -> Iterator[Held]:
    port, owner, following = workdirs
    staging = owner / "runs" / "tiny" / "vllm_staging"
    signature = _signature(owner, layer_ids=layer_ids, serve_python=serve_python)
    meta = {"server": {**signature, "port": port, "staging": str(staging)}}
    if kept:
        meta["keep"] = {"owner_run": "tiny", "idle_s": None, "since": "2026-12-04T10:00:00.000+00:00"}
    code, document, stderr = run_agent(owner, "job", "launch", "--name", "vllm-server", "--run", "tiny", "--meta",
                                       json.dumps(meta), "--", sys.executable, "-m", "http.server", str(port),
                                       "--bind", "127.0.0.1", env={"SPECOPS_SERVE_PYTHON": serve_python})
    assert code == 0, stderr[-2000:]
    job = document["job"]["id"]
    from specops.pipeline.vllm.ports import port_holder

    wait_until(lambda: (holder := port_holder(port)) is not None and holder.job == job, timeout_s=60,
               what="the server job to hold its port")
    try:
        yield Held(port, owner, following, job)
    finally:
        run_agent(owner, "job", "stop", job, "--grace", "2", env=ENV)
        Agent(owner).clean_up()
        Agent(following).clean_up()


@pytest.fixture
def kept_other_layers(workdirs) -> Iterator[Held]:
    """Kept by its run, capturing other layers than the next run's: it cannot serve the next run's extraction."""
    yield from _serve(workdirs, kept=True, layer_ids=[1, 2, 4])


@pytest.fixture
def kept_fitting(workdirs) -> Iterator[Held]:
    yield from _serve(workdirs, kept=True)


@pytest.fixture
def owned_fitting(workdirs) -> Iterator[Held]:
    """Fits the next run, but its run did not keep it (a server `invoke extract` left up for that run)."""
    yield from _serve(workdirs, kept=False)


def serve_env(root: Path) -> str:
    """A serve env of its own, as a host's inventory names one (envs.serve): another interpreter path than
    the agent's, so that a server started from it records another vllm_program."""
    python = root / "serve-env" / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    if not python.exists():
        python.symlink_to(sys.executable)
    return str(python)


@pytest.fixture
def kept_from_serve_env(workdirs) -> Iterator[Held]:
    """Kept by its run, fitting the next run, started from the host's serve env (not the agent's)."""
    yield from _serve(workdirs, kept=True, serve_python=serve_env(workdirs[1].parent))


@pytest.fixture
def owned_from_serve_env(workdirs) -> Iterator[Held]:
    yield from _serve(workdirs, kept=False, serve_python=serve_env(workdirs[1].parent))


_TAKE_OVER = """
import json
from specops.pipeline.run import Run
from specops.pipeline.vllm import take_over
print(json.dumps(take_over(Run("tiny"), {port}, "the test's own server needs the port")))
"""


def test_a_kept_server_the_next_run_cannot_use_passes_its_launch_and_is_stopped_when_it_needs_the_port(
        kept_other_layers: Held) -> None:
    held = kept_other_layers
    code, document, stderr = run_agent(held.next, "run", "check", "--run", "tiny", env=ENV)
    assert code == 0, document  # not refused: the run stops it before its own server
    code, document, stderr = run_agent(held.next, "plan", "--run", "tiny", env=ENV, timeout=600)
    assert document["loads"]["loads"][0]["replaces"] == \
        f"vLLM server job {held.job} of run tiny (kept for the next run)", stderr[-2000:]
    assert document["loads"]["reused"] == 0

    staging = held.owner / "runs" / "tiny" / "vllm_staging"  # a capture its client never moved (killed, say)
    staging.mkdir(parents=True, exist_ok=True)
    (staging / "chatcmpl-left.safetensors").write_bytes(b"\0" * 4096)

    code, document, stderr = _python(held.next, _TAKE_OVER.format(port=held.port))
    assert code == 0, stderr[-2000:]
    assert document == {"job": held.job, "owner": {"run": "tiny", "workdir": str(held.owner)},
                        "why": "the test's own server needs the port"}
    assert f"stopping vLLM server job {held.job}, kept by run tiny (workdir {held.owner})" in stderr
    record = json.loads((held.owner / "state" / "jobs" / f"{held.job}.json").read_text())
    assert record["state"] == "stopped"  # the owner's records say so: the stop was the owner's `job stop`
    assert list(staging.iterdir()) == [] and "removed 1 capture(s) (4,096 bytes) that no client moved" in stderr
    from specops.pipeline.vllm.ports import port_holder

    assert wait_until(lambda: port_holder(held.port) is None, timeout_s=30, what="the port to be free")


_LAUNCH_OWN = """
import json, sys
from specops.jobs.tmux import TmuxServer
from specops.host.paths import workdir
from specops.pipeline.run import Run
from specops.pipeline.vllm.job import find_or_launch
port = {port}
argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
record, reused = find_or_launch(Run("tiny"), {{"port": port, "purpose": "generate"}}, argv, {{}}, TmuxServer(workdir()))
print(json.dumps({{"id": record["id"], "reused": reused}}))
"""


def test_a_run_launching_a_server_of_its_own_stops_the_kept_one_on_its_port_first(kept_other_layers: Held) -> None:
    held = kept_other_layers
    code, document, stderr = _python(held.next, _LAUNCH_OWN.format(port=held.port))
    assert code == 0, stderr[-2000:]
    assert document["reused"] is False
    assert json.loads((held.owner / "state" / "jobs" / f"{held.job}.json").read_text())["state"] == "stopped"
    from specops.pipeline.vllm.ports import port_holder

    try:
        wait_until(lambda: (holder := port_holder(held.port)) is not None and holder.job == document["id"],
                   timeout_s=60, what="the next run's own server to hold the port")
    finally:
        run_agent(held.next, "job", "stop", document["id"], "--grace", "2", env=ENV)


def test_a_server_its_run_still_owns_is_refused_at_launch_when_the_run_would_need_its_port_later(
        owned_fitting: Held) -> None:
    held = owned_fitting
    code, document, _ = run_agent(held.next, "run", "check", "--run", "tiny", env=ENV)
    assert code == 0, document  # a step alone (`invoke extract`) uses it as it is
    code, document, _ = run_agent(held.next, "run", "check", "--run", "tiny", "--pipeline", env=ENV)
    assert code == 2, document
    line = document["error"]
    assert "\n" not in line
    assert f"is held by vLLM server job {held.job} of run 'tiny'" in line
    assert "which this run would use, but its later steps (the parity gate's served request) need the port" in line
    assert f"invoke stop --job {held.job}" in line
    # the pipeline itself, before its first step: nothing of the run written
    code, document, stderr = run_agent(held.next, "pipeline", "--run", "tiny", env=ENV)
    assert code == 2 and "still owns the server" in document["error"], document
    assert "== patches" not in stderr and not (held.next / "runs" / "tiny" / "prepared").exists()

    # a server it never needs a port of its own after (no served check, no vLLM evaluation): used as it is
    edit_run(held.next / "runs" / "tiny.yaml", parity={"serve": False})
    try:
        code, document, _ = run_agent(held.next, "run", "check", "--run", "tiny", "--pipeline", env=ENV)
        assert code == 0, document
    finally:
        edit_run(held.next / "runs" / "tiny.yaml", parity={"serve": None})
    # nor is the other run's server touched
    assert json.loads((held.owner / "state" / "jobs" / f"{held.job}.json").read_text())["state"] == "running"


def test_run_check_judges_the_port_the_hosts_engine_serves_on(owned_fitting: Held) -> None:
    """Node k of a run across hosts serves on vllm.port + k (two nodes on one machine never collide); its run
    check judges that port, as its engine does before its first step."""
    held = owned_fitting
    code, document, _ = run_agent(held.next, "run", "check", "--run", "tiny", "--pipeline", env=ENV)
    assert code == 2 and f"port {held.port} is held" in document["error"], document
    code, document, _ = run_agent(held.next, "run", "check", "--run", "tiny", "--pipeline", "--node-rank", "1",
                                  env=ENV)
    # node 1's port, free unless another process took it meanwhile: then that is what is named, never node 0's
    assert code == 0 or f"port {held.port + 1} is held" in document["error"], document
    code, document, _ = run_agent(held.next, "run", "check", "--run", "tiny", "--pipeline", "--node-rank", "0",
                                  env=ENV)
    assert code == 2, document


def test_the_plan_counts_no_load_for_a_live_server_that_fits_and_names_one_it_stops(
        kept_fitting: Held) -> None:
    held = kept_fitting
    code, document, stderr = run_agent(held.next, "plan", "--run", "tiny", env=ENV, timeout=600)
    assert code in (0, 1), stderr[-2000:]
    loads = document["loads"]
    assert loads["loads"][0]["serves"] == "the target, capturing hidden states"
    assert loads["loads"][0]["uses"] == f"vLLM server job {held.job} of run tiny"
    assert loads["loads"][0]["seconds"] == 0.0
    assert (loads["count"], loads["reused"]) == (len(loads["loads"]) - 1, 1)


def _python(workdir: Path, code: str) -> tuple[int, dict, str]:
    import subprocess

    from tests.support.agent import agent_env

    done = subprocess.run([sys.executable, "-c", code], cwd=workdir, capture_output=True, text=True, timeout=300,
                          env=agent_env(workdir, extra=ENV))
    lines = done.stdout.strip().splitlines()
    return done.returncode, json.loads(lines[-1]) if lines else {}, done.stderr


def test_run_check_and_plan_judge_the_run_with_the_serve_env_its_job_will_have(kept_from_serve_env: Held) -> None:
    held = kept_from_serve_env
    serve_python = serve_env(held.next.parent)
    # judged in the agent's own env, the kept server's vLLM is another program: it would not fit
    code, document, _ = run_agent(held.next, "run", "check", "--run", "tiny", "--pipeline", isolated=True)
    assert code == 2 and "its vllm_program differ" in document["error"], document
    # judged as the launched job will run (its SPECOPS_SERVE_PYTHON): the kept server fits, the launch passes
    code, document, _ = run_agent(held.next, "run", "check", "--run", "tiny", "--pipeline", "--serve-python",
                                  serve_python, isolated=True)
    assert code == 0, document
    assert document["settings"]["serve_python"] == serve_python
    code, document, stderr = run_agent(held.next, "plan", "--run", "tiny", "--serve-python", serve_python,
                                       isolated=True, timeout=600)
    assert code in (0, 1), stderr[-2000:]
    assert document["loads"]["loads"][0]["uses"] == f"vLLM server job {held.job} of run tiny"
    assert document["loads"]["reused"] == 1


@pytest.mark.parametrize("command", [("run", "check", "--pipeline"), ("plan",)])
def test_a_serve_env_that_is_not_there_is_one_line_before_anything_is_judged(workdirs, command) -> None:
    missing = str(workdirs[2] / "no-such-env" / "bin" / "python")
    code, document, _ = run_agent(workdirs[2], *command, "--run", "tiny", "--serve-python", missing, isolated=True)
    assert code == 2, document
    assert document["error"] == f"--serve-python {missing}: no such interpreter (inventory envs.serve)"


def test_invoke_judges_the_launch_in_the_hosts_serve_env(owned_from_serve_env: Held, tmp_path: Path) -> None:
    """The workstation hands the host's envs.serve to the run check: the server its run still owns is refused
    for what the job would find (its later steps need the port), not for a vLLM program it would not run."""
    held = owned_from_serve_env
    inventory = write_inventory(tmp_path / "inventory.yaml", {"local": {
        "connection": "local", "workdir": str(held.next), "python": sys.executable,
        "envs": {"serve": serve_env(held.next.parent)}}}, default="local")
    done = Cli(inventory, tmp_path / "logs")("pipeline", "--run", "tiny", timeout=300,
                                             SPECOPS_RUNS_DIR=str(held.next / "runs"))
    assert done.exit_code == 2, done.stdout + done.stderr
    assert "which this run would use, but its later steps" in done.stderr, done.stderr
    assert "vllm_program" not in done.stderr
    assert not (held.next / "runs" / "tiny" / "prepared").exists()  # refused before anything ran
