"""Online and hybrid training against a real vLLM CPU server and real speculators (issue 28).

One journey on a copy of the finished demo run, switched to `hidden_states.mode: online` with a disk
budget of 1 MB (its offline files take ~30 MB): the trainer is killed -9 after its first epoch, the
same command resumes; the server is killed -9 after the next epoch, the step fails naming the server
job, the same command relaunches the server and finishes. The draft is then scored on the held-out
prompts. A thread samples the hidden-state bytes on disk the whole time. Then the same run in hybrid
mode with a budget that holds half the files: extract writes them through the same server, the trainer
asks it for exactly the other half.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import yaml

from tests.support.agent import start_agent, wait_until
from tests.support.finished import copy_of
from tests.support.runs import edit_run
from tests.vllm.conftest import VLLM_PYTHON, agent, free_port, in_vllm_worker, needs_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm, in_vllm_worker]

BUDGET_GB = 0.001  # 1 MB: one generated row of the tiny run is ~0.2 MB
STEP_TIMEOUT_S = 900
DEAD_SERVER_BOUND_S = 60  # the step ends this soon after the server dies (speculators alone: minutes)


@dataclass
class DiskSampler:
    """Bytes of every file under the run's hidden-state folders, sampled while the steps run."""

    folders: tuple[Path, ...]
    peak: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def bytes_now(self) -> int:
        total = 0
        for folder in self.folders:
            for entry in folder.glob("*") if folder.is_dir() else []:
                try:
                    total += entry.stat().st_size if entry.is_file() else 0
                except OSError:
                    pass  # deleted between listing and stat
        return total

    def __enter__(self) -> DiskSampler:
        def loop() -> None:
            while not self._stop.is_set():
                self.peak = max(self.peak, self.bytes_now())
                self.samples += 1
                self._stop.wait(0.02)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def server_job(root: Path) -> dict | None:
    from specops.jobs import launching
    from specops.jobs.tmux import TmuxServer

    saved = os.environ.get("SPECOPS_WORKDIR")
    os.environ["SPECOPS_WORKDIR"] = str(root)
    try:
        return launching.running_job("vllm-server", "tiny", TmuxServer(root))
    finally:
        os.environ.pop("SPECOPS_WORKDIR") if saved is None else os.environ.__setitem__("SPECOPS_WORKDIR", saved)


def trainer_of(agent_pid: int) -> psutil.Process | None:
    """The `speculators train` process under the agent's train step."""
    try:
        children = psutil.Process(agent_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    return next((child for child in children if "train" in child.cmdline()
                 and any(part.endswith("speculators") for part in child.cmdline())), None)


def where_it_is(root: Path) -> str:
    """What a stage that did not come had reached: the trainer's last lines, the server job, the load."""
    log = root / "runs" / "tiny" / "checkpoints" / "train.log"
    lines = [line.strip()[:200] for line in log.read_text(errors="replace").splitlines() if line.strip()] \
        if log.is_file() else ["(no train.log)"]
    job = server_job(root)
    return (f"server job: {job['id'] if job else None}; load average: {os.getloadavg()}; "
            f"train.log ends: {' | '.join(lines[-4:])}")


def epochs_saved(root: Path) -> int:
    from specops.pipeline.training.command import is_complete

    folder = root / "runs" / "tiny" / "checkpoints"
    return sum(1 for entry in folder.glob("[0-9]*") if entry.name.isdigit() and is_complete(entry))


class Steps:
    """`python -m specops step ... --run tiny` on the online workdir, with the serve env."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON), "VLLM_CPU_KVCACHE_SPACE": "1"}
        self.launches = 0

    def run(self, *args: str) -> tuple[int, dict, str]:
        return agent(self.root, "step", *args, "--run", "tiny", env=self.env, timeout=STEP_TIMEOUT_S)

    def start_train(self) -> subprocess.Popen:
        # the step streams the trainer's log (~100 KB an epoch): into a file, never a pipe nobody reads
        # while the test waits, which fills at 64 KB and stalls the agent and then the trainer
        self.launches += 1
        stderr = (self.root.parent / f"train-{self.launches}.stderr").open("wb")
        with stderr:
            return start_agent(self.root, "step", "train", "--run", "tiny", env=self.env, stderr=stderr)


def finish(process: subprocess.Popen) -> tuple[int, dict]:
    """The launch's exit code and its one JSON document (stdout: one line, read at the end)."""
    out, _ = process.communicate(timeout=STEP_TIMEOUT_S)
    from tests.support.agent import one_document

    return process.returncode, one_document(out.decode())


def stop_server_job(root: Path) -> None:
    """The run's server job and every process of its group: the module leaves no server behind."""
    from specops.jobs import stopping
    from specops.jobs.tmux import TmuxServer

    job = server_job(root)
    if job is not None:
        saved = os.environ.get("SPECOPS_WORKDIR")
        os.environ["SPECOPS_WORKDIR"] = str(root)
        try:
            stopping.stop(job, 20.0, TmuxServer(root))
        finally:
            os.environ.pop("SPECOPS_WORKDIR") if saved is None else os.environ.__setitem__("SPECOPS_WORKDIR", saved)


@pytest.fixture(scope="module")
def online(finished, patched_vllm, tmp_path_factory) -> Iterator[dict]:
    """The journey of the module docstring; what each launch returned, and the disk's peak."""
    root = copy_of(finished, tmp_path_factory.mktemp("online") / "w")
    run_dir = root / "runs" / "tiny"
    shutil.rmtree(run_dir / "hidden_states")  # online: nothing extracted
    shutil.rmtree(run_dir / "checkpoints")
    # the server is the run's (backend vllm, which the plan asks of online runs); the answers and the
    # evaluation stay the offline run's (hf), so the two drafts differ only in where the states came from
    # the server outlives each step (vllm.keep_server): the relaunches reuse it, the hybrid test reads its counters
    edit_run(root / "runs" / "tiny.yaml", backend="vllm", vllm={"port": free_port(), "keep_server": True},
             regenerate={"backend": "hf"},
             evaluate={"backend": "hf"}, hidden_states={"mode": "online", "disk_budget_gb": BUDGET_GB},
             parity={"serve": False})  # the gate's served request is tests/parity's; here one server load less
    steps = Steps(root)
    journey: dict = {"root": root}
    try:  # a failing journey leaves no server behind either
        with DiskSampler((run_dir / "hidden_states", run_dir / "vllm_staging")) as disk:
            first = steps.start_train()
            trainer = wait_until(lambda: epochs_saved(root) >= 1 and trainer_of(first.pid), STEP_TIMEOUT_S,
                                 lambda: f"the first epoch's checkpoint; {where_it_is(root)}")
            trainer.send_signal(signal.SIGKILL)
            journey["trainer_pid"] = trainer.pid
            journey["trainer_killed"] = finish(first)

            second = steps.start_train()
            wait_until(lambda: epochs_saved(root) >= 2 and trainer_of(second.pid), STEP_TIMEOUT_S,
                       lambda: f"the second epoch's checkpoint; {where_it_is(root)}")
            job = server_job(root)
            os.killpg(int(job["pgid"]), signal.SIGKILL)
            killed_at = time.monotonic()
            journey["server_job"] = job["id"]
            journey["server_killed"] = finish(second)
            journey["server_failure_s"] = time.monotonic() - killed_at

            journey["resumed"] = steps.run("train")[:2]
        journey.update(peak=disk.peak, samples=disk.samples)
        journey["evaluated"] = steps.run("evaluate")[:2]
        yield journey
    finally:
        stop_server_job(root)


def test_a_killed_trainer_fails_the_step_naming_it_and_the_same_command_resumes(online):
    code, document = online["trainer_killed"]
    assert code == 1
    error = document["error"]
    assert error.startswith(f"the trainer (speculators train, pid {online['trainer_pid']}) was killed by SIGKILL; "
                            "run the same command to resume"), error
    assert "\n" not in error


def test_a_killed_server_fails_the_step_within_a_bound_naming_the_server_job(online):
    code, document = online["server_killed"]
    assert code == 1
    error = document["error"]
    assert error.startswith(f"vLLM server job {online['server_job']} died during training"), error
    assert "\n" not in error
    assert online["server_failure_s"] < DEAD_SERVER_BOUND_S


def test_the_same_command_relaunches_the_server_and_finishes_from_the_newest_checkpoint(online):
    code, document = online["resumed"]
    assert code == 0, document
    assert document["status"] == "done"
    assert document["resume"].startswith("resuming from epoch 2")
    assert document["checkpoints"]["newest_epoch"] == 3
    assert document["hidden_states"]["server"]["job"] != online["server_job"]  # a new server job


def test_the_hidden_states_on_disk_never_exceed_the_budget(online):
    assert online["samples"] > 1000  # sampled all along the three launches
    assert 0 < online["peak"] <= BUDGET_GB * 1e9
    watched = online["resumed"][1]["hidden_states"]["disk"]
    assert 0 < watched["peak_bytes"] <= watched["budget_bytes"] == BUDGET_GB * 1e9


def test_the_online_draft_accepts_like_the_offline_one(online, finished):
    code, document = online["evaluated"]
    assert code == 0, document
    offline = finished[1]["evaluation"]["report"]["mean_acceptance_length"]
    assert abs(document["report"]["mean_acceptance_length"] - offline) <= 0.1, (document["report"], offline)


def requests_served(port: int) -> float:
    """The server's finished requests (vLLM's own counter)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def test_hybrid_trains_on_the_files_the_budget_holds_and_generates_the_rest(online):
    root = online["root"]
    run_dir = root / "runs" / "tiny"
    from specops.pipeline.data import saved
    from specops.pipeline.extraction import budget

    rows = saved.column(run_dir / "prepared", "seq_len")
    half = len(rows) // 2
    reserve = budget.in_flight_reserve(rows, 4, 64, "float32", 1)
    allowance = sum(budget.row_bytes(tokens, 4, 64, "float32") for tokens in rows[:half]) + reserve
    config = root / "runs" / "tiny.yaml"
    # a little over: the budget is read in GB and must not round below the half's bytes
    edit_run(config, hidden_states={"mode": "hybrid", "disk_budget_gb": (allowance + 1000) / 1e9})
    steps = Steps(root)
    # new extraction inputs retire the online run's trained draft: said with --retire, as a user must
    code, extracted, _ = steps.run("extract", "--retire")
    assert code == 0, extracted
    assert extracted["counts"]["samples"] == half
    on_disk = sorted(run_dir.joinpath("hidden_states").glob("hs_*.safetensors"))
    assert len(on_disk) == half

    port = int(yaml.safe_load(config.read_text())["vllm"]["port"])
    before = requests_served(port)
    with DiskSampler((run_dir / "hidden_states", run_dir / "vllm_staging")) as disk:
        code, trained, _ = steps.run("train", "--fresh", "--epochs", "1")
    assert code == 0, trained
    assert requests_served(port) - before == len(rows) - half  # every row without a file, once
    assert sorted(run_dir.joinpath("hidden_states").glob("hs_*.safetensors")) == on_disk  # kept, not regenerated
    assert disk.peak <= allowance + 1000
