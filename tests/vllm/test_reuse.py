"""Between runs: a second run on the same target uses the server another run left up, when it fits.

The session's shared server is run tiny's in its own workdir, left up after its extract (a server of a
run whose config keeps it, vllm.keep_server); the refusals below start from one its run still owns (a kept one
is the next run's to stop: test_handover.py). A second workdir's run tiny (the same tiny weights and tokenizer, the same
serve settings) extracts through it: no server job of its own (0 loads in its job records), the step's
report names the owner, the owner's server is still up afterwards, and the files are byte for byte the
owner's for the same rows (sha256). The captures reached the second run through the owner's staging
folder (one filesystem: a rename) and none is left there. test_ports.py holds the refusal of a server
that does not fit.

A whole pipeline in a third workdir (backend vllm, no regenerate, no evaluate, other samples and epochs: run
settings vLLM does not see) passes the launch boundary, launches nothing ahead, extracts and checks fidelity
through the same server, and its summary counts 0 loads; the server is still up after it.

Last (it stops the session's server; a later user would start it again): the server kept with an idle
timeout is watched by a `vllm-keeper` job (vllm/keeper.py); `job list` (what `invoke status` renders) shows
it kept with its owner run and the seconds left; a run holding the server's lease keeps it in use; once
unused that long, the watch stops it and says why in its log.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.agent import REPO, agent_env, one_document, run_agent, wait_until
from tests.support.runs import edit_run
from tests.support.vllm import FIRST_SAMPLES, tiny_workdir
from tests.vllm.conftest import VLLM_PYTHON, in_vllm_worker, needs_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm, in_vllm_worker]

ENV = {"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON), "VLLM_CPU_KVCACHE_SPACE": "1"}
IDLE_S = 4


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _server_jobs(workdir: Path) -> list[dict]:
    jobs = workdir / "state" / "jobs"
    found = [json.loads(path.read_text()) for path in jobs.glob("*.json") if not path.name.endswith(".environ.json")]
    return [record for record in found if record.get("name") == "vllm-server"]


def test_a_second_workdir_extracts_through_the_other_runs_server(tmp_path, shared_vllm) -> None:
    server = shared_vllm.server()
    owner_files = server.workdir / "runs" / "tiny" / "hidden_states"
    workdir = tiny_workdir(tmp_path / "b", server.port)
    # what other users of the session's server left there before (an interrupted client's captures stay until
    # the owner's next sweep): not this run's to take
    staging = server.workdir / "runs" / "tiny" / "vllm_staging"
    left_before = {path.name for path in staging.glob("*.safetensors")}

    code, report, stderr = run_agent(workdir, "step", "extract", "--run", "tiny", "--samples", str(FIRST_SAMPLES),
                                     env=ENV, timeout=600)
    assert code == 0, json.dumps(report)[:2000] + stderr[-4000:]
    assert report["server"]["reused"] is True
    assert report["server"]["job"] == server.job["id"]
    assert report["server"]["owner"] == {"run": "tiny", "workdir": str(server.workdir), "job": server.job["id"]}
    assert f"reusing vLLM server job {server.job['id']} of run tiny (workdir {server.workdir}" in stderr
    assert _server_jobs(workdir) == []  # no load of its own

    # the owner's server is still the one running
    running = shared_vllm.running_job()
    assert running is not None and running["id"] == server.job["id"]
    # this run's captures passed through the owner's staging folder and are gone from it
    assert sorted({path.name for path in staging.glob("*.safetensors")} - left_before) == []

    mine = workdir / "runs" / "tiny" / "hidden_states"
    for row in range(FIRST_SAMPLES):
        name = f"hs_{row}.safetensors"
        assert _digest(mine / name) == _digest(owner_files / name), name


def test_a_second_workdirs_pipeline_loads_nothing(tmp_path, shared_vllm) -> None:
    import os

    server = shared_vllm.server()
    workdir = tiny_workdir(tmp_path / "c", server.port)
    os.symlink(REPO / "patches", workdir / "patches")
    edit_run(workdir / "runs" / "tiny.yaml", samples=8, train={"epochs": 1}, parity={"serve": False})

    code, summary, stderr = run_agent(workdir, "pipeline", "--run", "tiny", env=ENV, timeout=900)
    assert code == 0, json.dumps(summary)[:2000] + stderr[-4000:]
    assert summary["servers"]["starts"] == 0 and summary["servers"]["stopped"] is None, summary["servers"]
    assert "extract will use it, nothing launched ahead" in stderr
    assert f"reusing vLLM server job {server.job['id']} of run tiny" in stderr
    # the fidelity check asked the same server (its owner's staging swept of its requests' captures)
    report = json.loads((workdir / "runs" / "tiny" / "validate_report.json").read_text())
    assert report["checks"]["fidelity"]["detail"]["reference"] == "vllm", report["checks"]["fidelity"]
    assert summary["fidelity"] == 1.0
    assert _server_jobs(workdir) == []
    running = shared_vllm.running_job()
    assert running is not None and running["id"] == server.job["id"]


def test_a_server_that_does_not_fit_the_step_is_refused_in_one_line(tmp_path, shared_vllm) -> None:
    """Other layer ids pass the launch boundary (only the keys every server of a run shares are compared there)
    and are refused by the step, which compares the whole signature: one line naming the holder and what differs,
    exit 2, no server launched."""
    server = shared_vllm.owned()
    workdir = tiny_workdir(tmp_path / "d", server.port)
    edit_run(workdir / "runs" / "tiny.yaml", layer_ids=[1, 2, 4])

    code, document, stderr = run_agent(workdir, "step", "extract", "--run", "tiny", "--samples", "2", env=ENV,
                                       timeout=600)
    assert code == 2, json.dumps(document)[:2000] + stderr[-3000:]
    line = document["error"]
    assert "\n" not in line
    assert line.startswith(f"runs/tiny.yaml: vllm.port: port {server.port} is held by vLLM server job "
                           f"{server.job['id']} of run 'tiny'")
    assert "which does not fit this run (its layer_ids differ)" in line
    assert _server_jobs(workdir) == []


def test_a_pipeline_finds_a_server_capturing_other_layers_before_its_first_step(tmp_path, shared_vllm) -> None:
    """The pipeline's launch boundary compares the layer ids too when its first server captures hidden states (a
    kept server of another run that answers with its draft records none): one line naming the holder and what
    differs, exit 2, before the patches step and prepare, nothing written, no server launched."""
    server = shared_vllm.owned()
    workdir = tiny_workdir(tmp_path / "p", server.port)
    edit_run(workdir / "runs" / "tiny.yaml", layer_ids=[1, 2, 4])
    run_dir = workdir / "runs" / "tiny"

    code, document, stderr = run_agent(workdir, "pipeline", "--run", "tiny", env=ENV, timeout=300)
    assert code == 2, json.dumps(document)[:2000] + stderr[-3000:]
    line = document["error"]
    assert "\n" not in line
    assert f"is held by vLLM server job {server.job['id']} of run 'tiny'" in line
    assert "which does not fit this run (its layer_ids differ)" in line
    assert "== patches" not in stderr and "== prepare" not in stderr  # not one step began
    assert not run_dir.exists() or not any(run_dir.iterdir())
    assert _server_jobs(workdir) == []


_KEEP = """
import json, sys
from specops.pipeline.run import Run
from specops.pipeline.vllm.lifetime import keep_server
print(json.dumps(keep_server(Run("tiny", sys.argv[1]), int(sys.argv[2]))))
"""


def _server_row(workdir: Path, job: str) -> dict:
    code, document, stderr = run_agent(workdir, "job", "list", "--all")
    assert code == 0, stderr[-2000:]
    return next(row for row in document["jobs"] if row["id"] == job)


def test_a_kept_server_stops_itself_once_unused(shared_vllm) -> None:
    from specops.pipeline.vllm import sharing

    server = shared_vllm.server()
    workdir, job = server.workdir, server.job["id"]
    done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", _KEEP, str(workdir), str(IDLE_S)],
                          cwd=workdir, env=agent_env(workdir, extra={"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON)}),
                          capture_output=True, text=True, timeout=120)
    kept = one_document(done.stdout, done.stderr)
    assert done.returncode == 0 and kept["server"] == job and kept["idle_s"] == IDLE_S, done.stderr[-2000:]

    row = wait_until(lambda: (found := _server_row(workdir, job))["progress"]["kept"]["idle_left_s"] is not None
                     and found, timeout_s=60, what="the watch to note the server's last use")
    assert row["progress"]["kept"]["owner_run"] == "tiny"
    assert row["progress"]["kept"]["idle_s"] == IDLE_S
    assert 0 <= row["progress"]["kept"]["idle_left_s"] <= IDLE_S
    from remote.tasks.jobs import kept_line

    assert kept_line(row["progress"]).startswith(f"kept by run tiny, stops after {IDLE_S}s unused: ")

    # a run holding the lease (a borrower between its requests) is a use: the server is in use while it holds it
    # (its record written once, when the use began), and the countdown starts again when the use ends
    def keep() -> dict:
        return json.loads((workdir / "state" / "jobs" / f"{job}.json").read_text())["meta"]["keep"]

    first = keep()["last_used"]
    sharing.hold(workdir, job, "the test, as a borrower")
    try:
        wait_until(lambda: keep()["in_use"] is True, timeout_s=60, what="the watch to see the lease as a use")
        time.sleep(IDLE_S + 1)  # longer than the timeout: held, it is still up
        assert shared_vllm.running_job() is not None
        assert kept_line(_server_row(workdir, job)["progress"]) == \
            f"kept by run tiny, in use (stops after {IDLE_S}s unused)"
    finally:
        sharing.release(workdir, job)
    wait_until(lambda: keep()["in_use"] is False and keep()["last_used"] > first + IDLE_S, timeout_s=60,
               what="the watch to note the end of the use")

    wait_until(lambda: shared_vllm.running_job() is None, timeout_s=120, what="the idle server to be stopped")
    keeper_log = Path(json.loads((workdir / "state" / "jobs" / f"{kept['job']}.json").read_text())["log"])
    text = keeper_log.read_text()
    assert f"stopping vLLM server job {job}: unused for" in text
    assert f"(vllm.keep_server: {IDLE_S} s idle)" in text
