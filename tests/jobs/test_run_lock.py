"""A run's steps are exclusive on a host: while a job or step of run R runs, another one of R is refused
(exit 2, naming it, nothing written) or with --wait queued behind it. The hold is the holder's liveness
(job record + tmux session + process group, or pid + start time in this boot): a job killed -9 or a
host rebooted leaves nothing anyone must clear by hand."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.agent import Agent, group_alive, python_job, run_agent, wait_until

SLEEPER = python_job("import time; print('up', flush=True); time.sleep(1000)")
# Waits for a gate file, then exits 0.
GATED = python_job("import os, sys, time\nprint('up', flush=True)\nwhile not os.path.exists(sys.argv[1]):"
                   " time.sleep(0.05)")


def gated(gate: Path) -> list[str]:
    return [*GATED, str(gate)]


def lock_file(agent: Agent, run: str) -> dict:
    return json.loads((agent.workdir / "state" / "runs" / f"{run}.json").read_text())


def test_a_second_job_of_a_run_is_refused_naming_the_first_and_nothing_is_written(agent: Agent) -> None:
    first = agent.launch("train", SLEEPER, "--run", "r1")
    code, refusal = agent.call("launch", "--name", "prepare", "--run", "r1", "--", *SLEEPER)
    assert code == 2 and refusal["ok"] is False and refusal["running_job"] == first["id"]
    assert f"job {first['id']} (train)" in refusal["error"] and "--wait" in refusal["error"]
    assert len(agent.records_on_disk()) == 1 and len(list((agent.workdir / "logs").iterdir())) == 1
    assert lock_file(agent, "r1")["job"] == first["id"]

    from specops.contract.protocol import RUN_SERVICES
    from specops.pipeline.vllm import SERVER_JOB

    assert SERVER_JOB in RUN_SERVICES  # the job the extract and evaluate steps start for the run they hold
    server = agent.launch(SERVER_JOB, SLEEPER, "--run", "r1")  # the run's service, not a step of it
    other_run = agent.launch("prepare", SLEEPER, "--run", "r2")
    assert server["state"] == other_run["state"] == "running"


def test_a_step_run_directly_by_the_agent_is_refused_while_a_job_holds_its_run(agent: Agent) -> None:
    holder = agent.launch("pipeline", SLEEPER, "--run", "tiny")
    for step in (["step", "vocab"], ["step", "train"], ["pipeline"]):
        code, document, _ = run_agent(agent.workdir, *step, "--run", "tiny", env={"SPECOPS_JOB_ID": ""})
        assert code == 2 and holder["id"] in document["error"], document
    # a read-only command is never blocked (it fails here only because the run has no config)
    code, document, _ = run_agent(agent.workdir, "step", "metrics", "--run", "tiny", "--no-plot")
    assert "busy" not in document.get("error", "")


def test_a_step_run_directly_holds_the_run_against_a_launch(agent: Agent, tmp_path: Path) -> None:
    # a step the agent runs in its own process holds the run as the step commands do (runlock.held),
    # here around a wait for a gate instead of the step's work
    gate = tmp_path / "gate"
    script = ("import os, sys, time\nfrom specops.jobs import runlock\n"
              "with runlock.held('r1', 'step vocab'):\n    print('held', flush=True)\n"
              "    while not os.path.exists(sys.argv[1]): time.sleep(0.05)\n")
    process = subprocess.Popen([sys.executable, "-c", script, str(gate)], cwd=agent.workdir, env=agent.env(),
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline() == "held\n"
        code, refusal = agent.call("launch", "--name", "train", "--run", "r1", "--", *SLEEPER)
        assert code == 2 and f"process {process.pid} (step vocab)" in refusal["error"]
    finally:
        gate.touch()
        process.wait(timeout=30)
    assert not (agent.workdir / "state" / "runs" / "r1.json").exists()  # released when the step ended
    assert agent.launch("train", SLEEPER, "--run", "r1")["state"] == "running"


def test_the_hold_of_a_job_killed_minus_9_is_taken_over(agent: Agent) -> None:
    killed = agent.launch("train", SLEEPER, "--run", "r1")
    record = agent.wait_for_state(killed["id"], ("running",))
    os.kill(agent.record_on_disk(killed["id"])["wrapper_pid"], signal.SIGKILL)
    os.killpg(record["pgid"], signal.SIGKILL)
    wait_until(lambda: not group_alive(record["pgid"]), what="the killed job's processes to be gone")
    wait_until(lambda: agent.tmux(record["tmux_server"], "has-session", "-t", f"={killed['id']}").returncode != 0,
               what="its tmux session to close")
    again = agent.launch("prepare", SLEEPER, "--run", "r1")  # nobody cleared anything
    assert again["state"] == "running" and lock_file(agent, "r1")["job"] == again["id"]
    assert agent.show(killed["id"])["state"] in ("lost", "failed")


def test_the_hold_of_a_process_from_an_earlier_boot_is_taken_over(agent: Agent) -> None:
    from specops.jobs import processes

    runs = agent.workdir / "state" / "runs"
    runs.mkdir(parents=True)
    # this very pid and start time, but recorded in another boot: after a reboot it names someone else
    (runs / "r1.json").write_text(json.dumps({"pid": os.getpid(), "started": processes.start_ticks(os.getpid()),
                                              "boot_id": "an-earlier-boot", "what": "step train"}))
    assert agent.launch("train", SLEEPER, "--run", "r1")["state"] == "running"


def test_wait_queues_a_job_behind_the_holder_then_runs_it(agent: Agent, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    holder = agent.launch("train", gated(gate), "--run", "r1")
    queued = agent.launch("evaluate", python_job("print('evaluated')"), "--run", "r1", "--wait")
    assert queued["state"] == "pending"
    waiting = wait_until(lambda: agent.show(queued["id"]).get("waiting_for"), what="the queued job to wait")
    assert waiting == f"job {holder['id']} (train)"
    assert agent.show(queued["id"])["state"] == "pending"
    assert f"waiting for job {holder['id']}" in agent.wait_for_log(queued, "waiting for")
    gate.touch()
    assert agent.wait_for_state(holder["id"])["state"] == "succeeded"
    done = agent.wait_for_state(queued["id"])
    assert done["state"] == "succeeded" and Path(done["log"]).read_text().endswith("evaluated\n")


def test_a_queued_job_that_is_stopped_never_runs(agent: Agent, tmp_path: Path) -> None:
    holder = agent.launch("train", SLEEPER, "--run", "r1")
    marker = tmp_path / "ran"
    queued = agent.launch("evaluate", python_job("open(__import__('sys').argv[1], 'w')", str(marker)), "--run", "r1",
                          "--wait")
    wait_until(lambda: agent.show(queued["id"]).get("waiting_for"), what="the queued job to wait")
    assert agent.ok("stop", queued["id"], "--grace", "5")["job"]["state"] == "stopped"
    agent.ok("stop", holder["id"], "--grace", "5")
    assert not marker.exists()


def test_a_job_launched_within_the_holder_works_for_it(agent: Agent) -> None:
    holder = agent.launch("pipeline", SLEEPER, "--run", "r1")
    step = agent.launch("extract", SLEEPER, "--run", "r1", "--within", holder["id"])
    assert step["state"] == "running" and agent.record_on_disk(step["id"])["within"] == holder["id"]
    assert lock_file(agent, "r1")["job"] == holder["id"]
    agent.ok("stop", holder["id"], "--grace", "5")
    code, refusal = agent.call("launch", "--name", "train", "--run", "r1", "--", *SLEEPER)
    assert code == 2 and step["id"] in refusal["error"]  # the holder's work still runs


def test_a_step_run_directly_with_wait_waits_for_the_holder_then_runs(agent: Agent, tmp_path: Path) -> None:
    from tests.support.agent import start_agent

    gate = tmp_path / "gate"
    holder = agent.launch("train", gated(gate), "--run", "r1")
    step = start_agent(agent.workdir, "step", "vocab", "--run", "r1", "--wait", isolated=True, text=True)
    assert step.stderr is not None
    assert step.stderr.readline() == f"specops: run r1 is busy: waiting for job {holder['id']} (train) to end\n"
    assert step.poll() is None  # still waiting
    gate.touch()
    out, _ = step.communicate(timeout=120)
    # it ran once the holder ended: this run has no config, which only the step itself finds out
    assert step.returncode == 2 and "runs/r1.yaml" in json.loads(out)["error"]
    assert agent.show(holder["id"])["state"] == "succeeded"
