"""`invoke pipeline` across two hosts: a run config naming `hosts: [gpu1, gpu2]` runs the engine on both.

Two real sshds on loopback stand for two hosts, each with its own workdir (test_many_hosts' fixtures).
`--detach` returns at once with the first host's job id; the engine runs on the hosts, node 0 and node
1 meeting at a rendezvous on gpu1, so the workstation's invoke killed -9 in the middle changes nothing,
and the same command again attaches to the running engine instead of starting (or stopping) anything.
Each host regenerates and extracts its own share, every host ends with the bytes one host writes
alone, one torchrun training spans both (gloo on the CPU), and the checkpoint comes home. Bad `hosts:`
are one line.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import PYTHON, ssh_host
from tests.foundation.test_many_hosts import second_sshd  # noqa: F401  (a fixture: the second host's sshd)
from tests.support.cli import Cli, write_inventory
from tests.support.repo import REPO
from tests.support.sshd import SshServer, free_port

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

SAMPLES = 48  # regenerated rows are short: 48 of them fill two hf extraction batches, one per host
RUN = "across"
# where the workstation's invoke is killed -9: a random step of the engine on the first host
KILLED_AT = ("regenerate", "prepare", "extract", "vocab", "train")


def write_runs(root: Path, **changes: object) -> Path:
    """runs/across.yaml: the tiny demo on 48 rows, one epoch, 4 held-out prompts, answers regenerated
    (16 tokens), across gpu1 and gpu2."""
    runs = root / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((REPO / "runs" / "tiny.yaml").read_text())
    config.update(samples=SAMPLES, hosts=["gpu1", "gpu2"])
    config["train"]["epochs"] = 1
    config["regenerate"].update(enabled=True, max_tokens=16)
    config["evaluate"].update(heldout_prompts=4, max_tokens=16)
    config.update(changes)
    (runs / f"{RUN}.yaml").write_text(yaml.safe_dump(config))
    return runs


def hosts_inventory(root: Path, sshd: SshServer, second: SshServer, python2: str = PYTHON) -> Path:
    known_hosts = root / "known_hosts"
    known_hosts.write_text(sshd.known_hosts_line() + second.known_hosts_line())
    hosts = {"local": {"connection": "local", "workdir": str(root / "local-workdir"), "python": PYTHON},
             "gpu1": ssh_host(sshd, root / "gpu1-workdir", known_hosts),
             "gpu2": ssh_host(second, root / "gpu2-workdir", known_hosts, python=python2)}
    return write_inventory(root / "inventory.yaml", hosts, default="gpu1")


def hidden_states(root: Path, host: str) -> dict[str, bytes]:
    folder = root / f"{host}-workdir" / "runs" / RUN / "hidden_states"
    return {path.name: path.read_bytes() for path in sorted(folder.glob("hs_*.safetensors"))}


@pytest.fixture(scope="module")
def across(tmp_path_factory: pytest.TempPathFactory, sshd: SshServer, second_sshd: SshServer) -> tuple:  # noqa: F811
    """The pipeline launched detached; then followed by an invoke killed -9 at a random step; then the
    same command again, to the end (it attaches)."""
    root = tmp_path_factory.mktemp("across")
    cli = Cli(hosts_inventory(root, sshd, second_sshd), root / "logs")
    env = {"SPECOPS_RUNS_DIR": str(write_runs(root)), "SPECOPS_FETCHED": str(root / "fetched")}
    command = ("pipeline", "--run", RUN, "--port", str(free_port()))
    detached = cli(*command, "--detach", "--json", timeout=600, **env)
    assert detached.exit_code == 0, detached.stderr[-4000:]
    killed_at = random.choice(KILLED_AT)
    follower = cli.popen(*command, merge_streams=True, **env)
    assert follower.stdout is not None
    seen = ""
    for line in follower.stdout:  # the engine's log, as the follower shows it
        seen += line
        if f"== {killed_at}" in line:
            break
    follower.kill()  # SIGKILL: no handler of ours runs
    follower.wait()
    assert f"== {killed_at}" in seen, seen[-4000:]
    result = cli(*command, "--json", timeout=1500, **env)
    return cli, env, root, result, detached.json(), killed_at


def test_detached_the_engine_finishes_on_the_hosts_and_the_same_command_attaches_to_it(across: tuple) -> None:
    cli, env, _root, result, detached, killed_at = across
    assert result.exit_code == 0, (killed_at, result.stderr[-4000:])
    summary = result.json()
    # the command after the kill followed the very jobs the detached launch started: nothing new, nothing stopped
    assert summary["attached"] is True and summary["jobs"]["gpu1"] == detached["job"]["id"] == detached["jobs"]["gpu1"]
    assert summary["jobs"] == detached["jobs"]
    status = cli("status", "--hosts", "gpu1,gpu2", "--all", "--json", **env).json()
    for host in status["hosts"]:
        engines = [job for job in host["document"]["jobs"] if job["name"] == "pipeline"]
        assert [job["state"] for job in engines] == ["succeeded"], (host["host"], engines)
        assert engines[0]["id"] == detached["jobs"][host["host"]]
        assert not [job for job in host["document"]["jobs"] if job["state"] == "stopped"]


def test_a_run_naming_two_hosts_runs_every_step_and_fetches_a_loadable_checkpoint(across: tuple) -> None:
    from specops.contract import step_table
    from tests.e2e.test_pipeline_cli import _assert_loads_with_speculators

    _cli, _env, root, result, _detached, _killed_at = across
    assert result.exit_code == 0, result.stderr[-4000:]
    summary = result.json()
    assert summary["ok"] is True and summary["hosts"] == ["gpu1", "gpu2"] and summary["samples"] == SAMPLES
    assert list(summary["steps"]) == step_table.names()
    assert list(summary["on_hosts"]["gpu2"]) == step_table.names()
    assert summary["on_hosts"]["gpu2"]["validate"] == "on gpu1"  # the first host's step
    assert summary["fidelity"] >= 0.98
    for host in ("gpu1", "gpu2"):  # both nodes trained in one group of two
        log = root / f"{host}-workdir" / "runs" / RUN / "checkpoints" / "train.log"
        assert "dp_size=2" in log.read_text()
    assert summary["evaluation"]["report"]["prompts"] == 4
    checkpoint = root / "fetched" / summary["saved_on"] / RUN / "checkpoint"
    assert summary["fetched"] == str(checkpoint.parent)
    _assert_loads_with_speculators(checkpoint)


def test_fetch_across_the_hosts_finds_the_host_that_saved(across: tuple) -> None:
    cli, env, root, result, _detached, _killed_at = across
    saver = result.json()["saved_on"]
    shutil.rmtree(root / "fetched", ignore_errors=True)

    fetched = cli("fetch", "--hosts", "gpu2,gpu1", "--run", RUN, "--json", **env)

    assert fetched.exit_code == 0, fetched.stderr[-3000:]
    document = fetched.json()
    assert document["host"] == saver and document["destination"] == str(root / "fetched" / saver / RUN)
    assert (root / "fetched" / saver / RUN / "checkpoint" / "config.json").is_file()
    assert [path.name for path in (root / "fetched").iterdir()] == [saver]


def test_fetch_across_hosts_none_of_which_saved_is_one_line_naming_each_hosts_answer(across: tuple) -> None:
    cli, env, root, _result, _detached, _killed_at = across
    runs = Path(env["SPECOPS_RUNS_DIR"])
    (runs / "untrained.yaml").write_text((runs / f"{RUN}.yaml").read_text())  # a run no host has trained
    try:
        fetched = cli("fetch", "--hosts", "gpu1,gpu2", "--run", "untrained", **env)
    finally:
        (runs / "untrained.yaml").unlink()

    assert fetched.exit_code == 2, fetched.stderr[-3000:]
    lines = fetched.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specops: --hosts: no host holds a finished checkpoint of run "
                                                   "untrained: gpu1: "), lines
    assert "; gpu2: " in lines[0]
    assert not [host for host in ("gpu1", "gpu2") if (root / "fetched" / host / "untrained").exists()]


def regenerated(root: Path, host: str) -> Path:
    return root / f"{host}-workdir" / "runs" / RUN / "regenerated"


def test_each_host_regenerated_its_own_conversations_and_every_host_ends_with_the_one_host_answers(
        across: tuple) -> None:
    from specops.pipeline.run import Manifest

    cli, env, root, result, _detached, _killed_at = across
    assert result.exit_code == 0, result.stderr[-4000:]
    shares = result.json()["regenerate"]["shares"]
    (start1, stop1), (start2, stop2) = shares["gpu1"]["rows"], shares["gpu2"]["rows"]
    source = [json.loads(line)["id"] for line in (regenerated(root, "gpu1") / "source.jsonl").read_text().splitlines()]
    assert start1 == 0 < stop1 == start2 < stop2 == len(source)  # contiguous, disjoint, covering
    for host, part in (("gpu1", 0), ("gpu2", 1)):  # each answered only its share: the rest came host to host
        assert shares[host]["status"] == f"part {part} of 2"
        start, stop = shares[host]["rows"]
        written = (regenerated(root, host) / "parts" / f"part-{part}-of-2" / "responses.jsonl").read_text()
        answered = {json.loads(line)["primary_id"] for line in written.splitlines()}
        assert answered and answered <= set(source[start:stop])
        assert not (regenerated(root, host) / "chunks").exists()  # no batch outside the share was answered here

    alone = cli("regenerate", "--host", "local", "--run", RUN, "--json", timeout=900, **env)
    assert alone.exit_code == 0, alone.stderr[-3000:]
    one_host = regenerated(root, "local")
    records = {host: Manifest(root / f"{host}-workdir" / "runs" / RUN).record("regenerate")
               for host in ("local", "gpu1", "gpu2")}
    for host in ("gpu1", "gpu2"):  # byte for byte, recorded done with the one-host inputs hash
        for name in ("responses.jsonl", "responses.errors.jsonl"):
            assert (regenerated(root, host) / name).read_bytes() == (one_host / name).read_bytes(), (host, name)
        assert records[host]["status"] == "done" and records[host]["inputs_hash"] == records["local"]["inputs_hash"]


def test_each_host_extracted_its_own_rows_and_every_host_ends_with_the_files_one_host_writes(across: tuple) -> None:
    cli, env, root, result, _detached, _killed_at = across
    assert result.exit_code == 0, result.stderr[-4000:]
    extracted = result.json()["extract"]["shares"]
    shares = {host: {row for start, stop in info["spans"] for row in range(start, stop)}
              for host, info in extracted.items()}
    assert not shares["gpu1"] & shares["gpu2"] and shares["gpu1"] | shares["gpu2"] == set(range(SAMPLES))
    for host, info in extracted.items():  # each wrote only its share: the rest came host to host
        assert info["written"] == info["rows"] == len(shares[host]) > 0
    copies = result.json()["extract"]["exchanged"]["copies"]
    assert sorted((copy["from"], copy["to"], copy["files"]) for copy in copies) == [
        ("gpu1", ["gpu2"], len(shares["gpu1"])), ("gpu2", ["gpu1"], len(shares["gpu2"]))]

    alone = cli("extract", "--host", "local", "--run", RUN, "--skip-doctor", "--json", timeout=900, **env)
    assert alone.exit_code == 0, alone.stderr[-3000:]
    one_host = hidden_states(root, "local")
    assert len(one_host) == SAMPLES
    assert hidden_states(root, "gpu1") == one_host and hidden_states(root, "gpu2") == one_host  # byte for byte


def test_a_second_run_across_the_hosts_skips_the_work_already_done(across: tuple) -> None:
    cli, env, root, first, _detached, _killed_at = across
    assert first.exit_code == 0, first.stderr[-4000:]
    logs = [root / f"{host}-workdir" / "runs" / RUN / "checkpoints" / "train.log" for host in ("gpu1", "gpu2")]
    launches = [log.read_text().count("### specops launch") for log in logs]
    again = cli("pipeline", "--run", RUN, "--skip-doctor", "--port", str(free_port()), "--json", timeout=900, **env)
    assert again.exit_code == 0, again.stderr[-4000:]
    summary = again.json()
    assert summary["attached"] is False  # the first run's engines had ended: a new launch, every step skips
    for host in ("gpu1", "gpu2"):
        for step, status in summary["on_hosts"][host].items():  # no step did any work again
            assert status in ("ok", "skipped: unchanged") or status.startswith("on gpu"), (host, step, status)
    assert {info["status"] for info in summary["extract"]["shares"].values()} == {"skipped: unchanged"}
    assert {info["status"] for info in summary["regenerate"]["shares"].values()} == {"skipped: unchanged"}
    assert summary["regenerate"]["exchanged"] is None
    assert summary["extract"]["exchanged"]["copies"] == []  # every host already holds every file
    assert summary["epochs"] == first.json()["epochs"]
    # both nodes skipped together: no trainer was started on either host
    assert [log.read_text().count("### specops launch") for log in logs] == launches


def test_a_doctor_error_on_the_hosts_refuses_the_run_before_anything_is_launched(
        tmp_path: Path, sshd: SshServer, second_sshd: SshServer) -> None:  # noqa: F811
    from tests.support.runs import edit_run

    runs = write_runs(tmp_path)
    edit_run(runs / f"{RUN}.yaml", train={"extra_args": ["--no-such-flag"]})
    cli = Cli(hosts_inventory(tmp_path, sshd, second_sshd), tmp_path / "logs")
    refused = cli("pipeline", "--run", RUN, timeout=600, SPECOPS_RUNS_DIR=str(runs))
    assert refused.exit_code == 1, refused.stderr[-3000:]
    assert "doctor found" in refused.stderr and "nothing was launched on any host" in refused.stderr
    status = cli("status", "--hosts", "gpu1,gpu2", "--json", SPECOPS_RUNS_DIR=str(runs)).json()
    assert [host["document"]["jobs"] for host in status["hosts"]] == [[], []]


@pytest.mark.parametrize(("hosts", "flag", "expected"), [
    (["gpu1", "nowhere"], None, "runs/across.yaml: hosts: 'nowhere' is not a host of"),
    (["gpu1"], None, "runs/across.yaml: hosts: a pipeline across hosts needs at least two (got 1)"),
    (["gpu1", "gpu1"], None, "runs/across.yaml: hosts: 'gpu1' is named twice"),
    ("gpu1", None, "runs/across.yaml: hosts: must be a list of inventory host names"),
    (None, "gpu1,gpu1", "--hosts: 'gpu1' is named twice"),
    (None, "gpu1", "--hosts: a pipeline across hosts needs at least two (got 1)"),
    (None, "gpu1,nowhere", "nowhere"),
])
def test_bad_hosts_are_one_line_and_exit_2_before_any_host_is_touched(
        tmp_path: Path, sshd: SshServer, second_sshd: SshServer, hosts: object, flag: str | None,  # noqa: F811
        expected: str) -> None:
    runs = write_runs(tmp_path, hosts=hosts) if hosts is not None else write_runs(tmp_path)
    cli = Cli(hosts_inventory(tmp_path, sshd, second_sshd), tmp_path / "logs")
    args = ["pipeline", "--run", RUN, *(["--hosts", flag] if flag else [])]
    result = cli(*args, SPECOPS_RUNS_DIR=str(runs))
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines
    assert not (tmp_path / "gpu1-workdir").exists() and not (tmp_path / "gpu2-workdir").exists()
