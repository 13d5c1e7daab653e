"""A kept server's stated lifetime: `vllm.keep_server` is false, true (until stopped by hand) or an idle
timeout (`30m`, `2h`, `90s`, seconds); a bad value is one line naming the file and key (exit 2).

With an idle timeout, the run's last server is watched by a `vllm-keeper` job (vllm/keeper.py): `job list`
(what `invoke status` renders) shows the server kept with its owner run and the seconds left; a run
holding the server's lease keeps it in use; once unused that long, the watch stops it and says why in its
log. The real server is the session's shared one (stopped here; the next user starts it again).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.agent import REPO, agent_env, one_document, run_agent, wait_until
from tests.support.runs import edit_run
from tests.support.vllm import tiny_workdir
from tests.vllm.conftest import VLLM_PYTHON, free_port, in_vllm_worker, needs_vllm

IDLE_S = 4


@pytest.mark.parametrize(("value", "seconds"), [(True, True), (False, False), ("30m", 1800), (90, 90), ("2h", 7200),
                                                ("45s", 45)])
def test_keep_server_values(tmp_path, value, seconds) -> None:
    import os

    workdir = tiny_workdir(tmp_path / "w", free_port())
    edit_run(workdir / "runs" / "tiny.yaml", vllm={"keep_server": value})
    os.environ["SPECOPS_WORKDIR"] = str(workdir)
    from specops.pipeline.run.config import load_run_config

    assert load_run_config(workdir / "runs" / "tiny.yaml").vllm.keep_server == seconds


@pytest.mark.parametrize(("value", "says"), [("soon", "'soon' is not true, false or an idle timeout"),
                                             (0, "an idle timeout of 0 is under a second"),
                                             ([30], "[30] is not true, false or an idle timeout")])
def test_a_bad_keep_server_is_one_line_exit_2(tmp_path, value, says) -> None:
    workdir = tiny_workdir(tmp_path / "w", free_port())
    edit_run(workdir / "runs" / "tiny.yaml", vllm={"keep_server": value})
    code, document, _ = run_agent(workdir, "run", "check", "--run", "tiny")
    assert code == 2, document
    assert "\n" not in document["error"]
    assert document["error"].startswith(f"runs/tiny.yaml: vllm.keep_server: {says}"), document["error"]


def test_status_says_who_kept_the_server_and_the_idle_time_left() -> None:
    from remote.tasks.jobs import kept_line

    assert kept_line({"kept": {"owner_run": "a", "idle_s": None, "idle_left_s": None}}) == \
        "kept by run a, until stopped (vllm.keep_server: true)"
    assert kept_line({"kept": {"owner_run": "a", "idle_s": 1800, "idle_left_s": 754.2}}) == \
        "kept by run a, stops after 30m00s unused: 12m34s left"
    assert kept_line({"kept": {"owner_run": "a", "idle_s": 7200, "idle_left_s": 7200}}) == \
        "kept by run a, stops after 2h00m unused: 2h00m left"


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


@pytest.mark.vllm
@pytest.mark.slow
@needs_vllm
@in_vllm_worker
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

    # a run holding the lease (a borrower between its requests) is a use: the watch moves the last use on
    first = json.loads((workdir / "state" / "jobs" / f"{job}.json").read_text())["meta"]["keep"]["last_used"]
    sharing.hold(workdir, job, "the test, as a borrower")
    try:
        def last_used() -> float:
            return json.loads((workdir / "state" / "jobs" / f"{job}.json").read_text())["meta"]["keep"]["last_used"]

        wait_until(lambda: last_used() > first + IDLE_S, timeout_s=60, what="the watch to see the lease as a use")
        assert shared_vllm.running_job() is not None
    finally:
        sharing.release(workdir, job)

    wait_until(lambda: shared_vllm.running_job() is None, timeout_s=120, what="the idle server to be stopped")
    keeper_log = Path(json.loads((workdir / "state" / "jobs" / f"{kept['job']}.json").read_text())["log"])
    text = keeper_log.read_text()
    assert f"stopping vLLM server job {job}: unused for" in text
    assert f"(vllm.keep_server: {IDLE_S} s idle)" in text
