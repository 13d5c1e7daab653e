"""Servers on one host, the trainer on another (issue 40): the run's `hosts: {serve: [gpu1], train: [gpu2]}`
in hidden_states.mode online over the file backend, the states on a folder both hosts see
(hidden_states.shared_dir). Two loopback sshd hosts, the real vLLM CPU server (the serve env) on gpu1,
real speculators training on gpu2.

One journey on copies of the finished demo run (its prepared data, nothing extracted, nothing trained):
`invoke pipeline --hosts "serve=gpu1;train=gpu2"`; after the first saved epoch the serve host's server is
killed -9: one line naming the serve host and its server. The same command again; after the next saved
epoch the trainer is killed -9: one line naming it. The same command again finishes from the newest
checkpoint, the serve host's server counting exactly one request a row an epoch it trained, and the draft
scores like the offline (file on disk) draft of the same data. Before all that, the same roles on the command
line with an offline run config are refused, one line, before any step.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import psutil
import pytest
import yaml

from tests.conftest import ssh_host
from tests.foundation.test_many_hosts import second_sshd  # noqa: F401  (a fixture: the second host's sshd)
from tests.support.agent import Agent, wait_until
from tests.support.cli import Cli, write_inventory
from tests.support.finished import copy_of
from tests.support.sshd import SshServer, two_free_ports
from tests.vllm.conftest import VLLM_PYTHON, in_vllm_worker, needs_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.ssh, pytest.mark.slow, needs_vllm, in_vllm_worker]

T = TypeVar("T")
RUN = "tiny"
ROLES = "serve=gpu1;train=gpu2"
LAUNCH_TIMEOUT_S = 1800
DEAD_BOUND_S = 90  # a launch ends this soon after its server or its trainer is killed


def epochs_saved(workdir: Path) -> int:
    from specops.pipeline.training.command import is_complete

    folder = workdir / "runs" / RUN / "checkpoints"
    return sum(1 for entry in folder.glob("[0-9]*") if entry.name.isdigit() and is_complete(entry))


def running_server(workdir: Path) -> dict | None:
    running = [record for record in Agent(workdir).records_on_disk()
               if record["name"] == "vllm-server" and record.get("state") in ("running", "starting")]
    return running[-1] if running else None


def trainer_in(workdir: Path) -> psutil.Process | None:
    """The `speculators train` process saving into this workdir's run."""
    save_path = str(workdir / "runs" / RUN / "checkpoints")
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any(part.endswith("speculators") for part in cmdline) and "train" in cmdline \
                and any(save_path in part for part in cmdline):
            return process
    return None


def one_line_error(result: tuple[int, str, str]) -> str:
    """The one error line of a failed `invoke ... --json` (its document's `error`)."""
    error = json.loads(result[1])["error"]
    assert "\n" not in error, error
    return error


def role_run(root: Path, finished, servers: dict[str, SshServer], roles: dict[str, list[str]], epochs: int | None = None
             ) -> tuple[dict[str, Path], Path, Path, dict, Cli, dict[str, str]]:
    """Copies of the finished demo run (its prepared data, nothing extracted, nothing trained) on each host of
    `roles` (host name -> its sshd), the run config by role in online mode over a shared folder:
    (workdirs, shared folder, runs folder, run config, cli, env)."""
    names = [*roles["serve"], *roles["train"]]
    workdirs = {name: copy_of(finished, root / f"{name}-workdir") for name in names}
    for workdir in workdirs.values():  # online: nothing extracted; nothing trained yet
        shutil.rmtree(workdir / "runs" / RUN / "hidden_states")
        shutil.rmtree(workdir / "runs" / RUN / "checkpoints")
    shared = root / "shared"
    shared.mkdir()
    runs = root / "runs"
    runs.mkdir()
    config = yaml.safe_load((workdirs[names[0]] / "runs" / f"{RUN}.yaml").read_text())
    # the server is the run's (backend vllm); the answers and the evaluation stay the offline run's (hf), so
    # the two drafts differ only in where the states came from
    config.update(backend="vllm", hosts=roles)
    config.setdefault("vllm", {})["port"] = two_free_ports()  # serve host k listens on port + its rank
    config["regenerate"]["backend"] = "hf"
    config["evaluate"]["backend"] = "hf"
    config["hidden_states"] = {"mode": "online", "shared_dir": str(shared)}
    config["parity"] = {"serve": False}  # the gate's served request is tests/parity's
    if epochs is not None:
        config["train"]["epochs"] = epochs
    (runs / f"{RUN}.yaml").write_text(yaml.safe_dump(config))
    known_hosts = root / "known_hosts"
    known_hosts.write_text("".join({server.known_hosts_line() for server in servers.values()}))
    hosts = {name: ssh_host(servers[name], workdirs[name], known_hosts, envs={"serve": str(VLLM_PYTHON)})
             for name in names}
    cli = Cli(write_inventory(root / "inventory.yaml", hosts, default=names[0]), root / "logs")
    env = {"SPECOPS_RUNS_DIR": str(runs), "SPECOPS_FETCHED": str(root / "fetched"), "VLLM_CPU_KVCACHE_SPACE": "1"}
    return workdirs, shared, runs, config, cli, env


@pytest.fixture(scope="module")
def journey(finished, patched_vllm, tmp_path_factory, sshd: SshServer, second_sshd: SshServer  # noqa: F811
            ) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("roles")
    workdirs, shared, runs, config, cli, env = role_run(
        root, finished, {"gpu1": sshd, "gpu2": second_sshd}, {"serve": ["gpu1"], "train": ["gpu2"]})
    argv = ("pipeline", "--run", RUN, "--hosts", ROLES, "--json")

    def launch() -> subprocess.Popen:
        return cli.popen(*argv, "--port", str(two_free_ports()), **env)

    def ended(process: subprocess.Popen) -> tuple[int, str, str]:
        out, err = process.communicate(timeout=LAUNCH_TIMEOUT_S)
        return process.returncode, out, err

    def while_running(process: subprocess.Popen, probe: Callable[[], T], what: str) -> T:
        def looked() -> T:
            if process.poll() is not None:
                code, out, err = ended(process)
                raise AssertionError(f"the launch ended (exit {code}) before {what}: {out[-2000:]} {err[-3000:]}")
            return probe()
        return wait_until(looked, LAUNCH_TIMEOUT_S, what)

    found: dict = {"workdirs": workdirs, "shared": shared, "config": config}
    try:
        # roles on the command line only, with a run config that cannot carry them: refused before any step
        offline = {key: value for key, value in config.items() if key != "hosts"}
        offline["hidden_states"] = {"mode": "offline"}
        (runs / f"{RUN}.yaml").write_text(yaml.safe_dump(offline))
        found["offline_refused"] = ended(launch())
        (runs / f"{RUN}.yaml").write_text(yaml.safe_dump(config))

        first = launch()
        while_running(first, lambda: epochs_saved(workdirs["gpu2"]) >= 1 and running_server(workdirs["gpu1"]),
                      "gpu2's first saved epoch")
        server = running_server(workdirs["gpu1"])
        os.killpg(int(server["pgid"]), signal.SIGKILL)
        killed_at = time.monotonic()
        found.update(server=server, server_killed=ended(first), server_bound_s=time.monotonic() - killed_at)

        second = launch()
        saved = epochs_saved(workdirs["gpu2"])
        trainer = while_running(second, lambda: epochs_saved(workdirs["gpu2"]) > saved and trainer_in(workdirs["gpu2"]),
                                "the resumed training's next saved epoch")
        trainer.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        found.update(trainer_pid=trainer.pid, trainer_killed=ended(second),
                     trainer_bound_s=time.monotonic() - killed_at)

        found["finished"] = ended(launch())
        yield found
    finally:
        for workdir in workdirs.values():
            Agent(workdir).clean_up()


def test_roles_on_the_command_line_with_an_offline_run_are_refused_before_any_step(journey):
    code, out, err = journey["offline_refused"]
    assert code != 0, out[-2000:] + err[-3000:]
    line = one_line_error((code, out, err))
    assert f"runs/{RUN}.yaml" in line and "hidden_states.mode online" in line and "not offline" in line, line
    job = re.search(r"job (pipeline-\S+) failed", line)
    assert job, line
    # the serve host's pipeline job ended at the run check: its summary has no step
    summary = json.loads((journey["workdirs"]["gpu1"] / "logs" / f"{job[1]}.log").read_text().splitlines()[-1])
    assert summary["ok"] is False and summary["steps"] == {} and summary["failed_step"] is None, summary


def test_a_killed_server_on_the_serve_host_ends_the_run_with_one_line_naming_it(journey):
    code, _out, err = journey["server_killed"]
    assert code != 0
    line = one_line_error((code, _out, err))
    assert "serve host gpu1" in line and journey["server"]["id"] in line and "stopped answering" in line, err[-3000:]
    assert "run the same command to resume" in line
    assert journey["server_bound_s"] < DEAD_BOUND_S


def test_a_killed_trainer_on_the_train_host_ends_the_run_with_one_line_naming_it(journey):
    code, _out, err = journey["trainer_killed"]
    assert code != 0
    line = one_line_error((code, _out, err))
    assert "gpu2" in line and f"pid {journey['trainer_pid']}" in line and "SIGKILL" in line, err[-3000:]
    assert journey["trainer_bound_s"] < DEAD_BOUND_S


def test_the_same_command_finishes_from_the_newest_checkpoint_on_the_train_host(journey):
    code, out, err = journey["finished"]
    assert code == 0, out[-3000:] + err[-6000:]
    summary = json.loads(out)
    assert summary["ok"] is True and summary["saved_on"] == "gpu2"
    assert summary["resume"].startswith("resuming from epoch"), summary["resume"]
    assert epochs_saved(journey["workdirs"]["gpu2"]) == journey["config"]["train"]["epochs"]
    assert not (journey["workdirs"]["gpu1"] / "runs" / RUN / "checkpoints").exists()  # the serve host trains nothing
    assert summary["roles"]["served_by"] == "gpu1"


def test_the_serve_host_served_one_request_a_row_an_epoch_nothing_lost_or_doubled(journey):
    code, out, _err = journey["finished"]
    assert code == 0
    accounting = json.loads(out)["roles"]["accounting"]
    assert accounting["epochs_trained"] >= 1
    assert accounting["served_requests"] == accounting["expected_requests"] == \
        accounting["rows"] * accounting["epochs_trained"], accounting
    # the states went through the shared folder, and none is left there (the trainer deletes what it loads)
    staged = [path for path in journey["shared"].rglob("*") if path.is_file()]
    assert staged == [], staged[:5]


def test_the_role_split_draft_scores_like_the_offline_draft_of_the_same_data(journey, finished):
    code, out, _err = journey["finished"]
    assert code == 0
    ours = json.loads(out)["evaluation"]["report"]["mean_acceptance_length"]
    offline = finished[1]["evaluation"]["report"]["mean_acceptance_length"]
    assert abs(ours - offline) <= 0.1, (ours, offline)


@pytest.fixture(scope="module")
def two_servers(finished, patched_vllm, tmp_path_factory, sshd: SshServer, second_sshd: SshServer  # noqa: F811
                ) -> Iterator[dict]:
    """Two serve hosts (gpu1, gpu3: one sshd, two workdirs) and one train host, one epoch, one launch."""
    root = tmp_path_factory.mktemp("two-servers")
    workdirs, shared, _runs, config, cli, env = role_run(
        root, finished, {"gpu1": sshd, "gpu3": sshd, "gpu2": second_sshd},
        {"serve": ["gpu1", "gpu3"], "train": ["gpu2"]}, epochs=1)
    try:
        done = cli("pipeline", "--run", RUN, "--json", "--port", str(two_free_ports()), timeout=LAUNCH_TIMEOUT_S, **env)
        yield {"workdirs": workdirs, "shared": shared, "config": config,
               "done": (done.exit_code, done.stdout, done.stderr)}
    finally:
        for workdir in workdirs.values():
            Agent(workdir).clean_up()


def test_two_serve_hosts_each_answer_their_share_of_one_trainers_rows(two_servers):
    code, out, err = two_servers["done"]
    assert code == 0, out[-3000:] + err[-6000:]
    summary = json.loads(out)
    assert summary["ok"] is True and summary["saved_on"] == "gpu2"
    assert summary["roles"]["served_by"] == "gpu1,gpu3"
    accounting = summary["roles"]["accounting"]
    each = accounting["served_by_host"]
    # row i asks server i mod 2 (patch set speculators-0.9.0-endpoints): halves, nothing lost or asked twice
    assert set(each) == {"gpu1", "gpu3"} and min(each.values()) > 0, accounting
    assert abs(each["gpu1"] - each["gpu3"]) <= accounting["epochs_trained"], accounting
    assert accounting["served_requests"] == accounting["expected_requests"] == \
        accounting["rows"] * accounting["epochs_trained"], accounting
    assert [path for path in two_servers["shared"].rglob("*") if path.is_file()] == []
    for serve_host in ("gpu1", "gpu3"):  # neither serve host trains
        assert not (two_servers["workdirs"][serve_host] / "runs" / RUN / "checkpoints").exists()
    evaluation = summary["evaluation"]
    assert evaluation["report"]["mean_acceptance_length"] >= evaluation["untrained"]["mean_acceptance_length"]
