"""`invoke check|doctor|patch verify|status --hosts a,b` (or `--all`): every host in parallel, one row each.

Two real sshds on loopback (the session's and one more) stand for two GPU hosts, each with its own
workdir; a third inventory host answers nowhere. One host failing never hides the others' rows.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ssh_host
from tests.support.cli import Cli, write_inventory
from tests.support.sshd import SshServer, free_port, start_sshd

pytestmark = pytest.mark.ssh

# The host's python, recording when each agent call starts and ends: overlapping intervals prove
# the hosts were asked at the same time (never a timed assertion).
RECORDING_PYTHON = """#!/bin/sh
echo "start $(date +%s.%N)" >> '{log}'
sleep 1
'{python}' "$@"
code=$?
echo "end $(date +%s.%N)" >> '{log}'
exit $code
"""


@pytest.fixture(scope="module")
def second_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    server = start_sshd(tmp_path_factory.mktemp("sshd-2"))
    yield server
    server.stop()


@pytest.fixture
def two_hosts(tmp_path: Path, sshd: SshServer, second_sshd: SshServer) -> Path:
    """gpu1 and gpu2 (two sshds), `dead` (a closed port) and `local`, default local."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(sshd.known_hosts_line() + second_sshd.known_hosts_line())
    hosts = {
        "local": {"connection": "local", "workdir": str(tmp_path / "local-workdir"), "python": PYTHON},
        "gpu1": ssh_host(sshd, tmp_path / "gpu1-workdir", known_hosts),
        "gpu2": ssh_host(second_sshd, tmp_path / "gpu2-workdir", known_hosts),
        "dead": {**ssh_host(sshd, tmp_path / "dead-workdir", known_hosts), "port": free_port(), "connect_timeout": 2},
    }
    return write_inventory(tmp_path / "inventory.yaml", hosts, default="local")


@pytest.fixture
def many(two_hosts: Path, tmp_path: Path) -> Cli:
    return Cli(two_hosts, tmp_path / "logs")


def rows_by_host(document: dict) -> dict[str, dict]:
    return {row["host"]: row for row in document["hosts"]}


def test_check_of_two_hosts_is_one_document_with_a_row_each_in_the_order_named(many: Cli, tmp_path: Path) -> None:
    result = many("check", "--hosts", "gpu2,gpu1", "--json")
    assert result.exit_code == 0, result.stderr
    document = result.json()
    assert document["ok"] is True
    assert [row["host"] for row in document["hosts"]] == ["gpu2", "gpu1"]
    for row in document["hosts"]:
        assert row["ok"] and row["exit_code"] == 0
        assert row["document"]["host"] == row["host"]
        assert row["document"]["envs"]["default"]["packages"]["torch"]
        assert "torch" in row["summary"]
        # each host got its own agent, in its own workdir, over its own sshd
        assert (tmp_path / f"{row['host']}-workdir" / "state" / "agent.sha256").is_file()


def test_the_hosts_are_asked_at_the_same_time(two_hosts: Path, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    wrapper = tmp_path / "recording-python"
    wrapper.write_text(RECORDING_PYTHON.format(log=log, python=PYTHON))
    wrapper.chmod(0o755)
    two_hosts.write_text(two_hosts.read_text().replace(f"python: {PYTHON}", f"python: {wrapper}"))
    result = Cli(two_hosts, tmp_path / "logs")("check", "--hosts", "gpu1,gpu2", "--json")
    assert result.exit_code == 0, result.stderr
    events = [line.split() for line in log.read_text().splitlines()]
    starts = sorted(float(stamp) for kind, stamp in events if kind == "start")
    ends = sorted(float(stamp) for kind, stamp in events if kind == "end")
    assert len(starts) >= 2 and len(ends) >= 2
    # the second host's call began before the first one's ended: in parallel, not one after the other
    assert starts[1] < ends[0]


def test_an_unreachable_host_is_its_own_failed_row_and_the_others_still_report(many: Cli) -> None:
    started = time.monotonic()
    result = many("check", "--hosts", "gpu1,dead,gpu2", "--json", timeout=120)
    assert result.exit_code == 1
    rows = rows_by_host(result.json())
    assert result.json()["ok"] is False
    assert rows["gpu1"]["ok"] and rows["gpu2"]["ok"]
    assert rows["dead"]["ok"] is False and rows["dead"]["exit_code"] == 1
    assert "dead" in rows["dead"]["summary"] and "127.0.0.1" in rows["dead"]["summary"]
    assert time.monotonic() - started < 120


def test_all_hosts_as_a_table_with_a_row_per_host_and_a_verdict(many: Cli) -> None:
    result = many("check", "--all", timeout=120)
    assert result.exit_code == 1  # `dead` answers nowhere
    table = result.stdout
    for name in ("local", "gpu1", "gpu2", "dead"):
        assert any(line.strip("│ ").startswith(name) for line in table.splitlines()), table
    assert "1 of 4 host(s) FAILED" in table


def test_doctor_of_two_hosts_counts_each_hosts_findings(many: Cli) -> None:
    result = many("doctor", "--hosts", "gpu1,gpu2", "--json", timeout=180)
    rows = rows_by_host(result.json())
    assert set(rows) == {"gpu1", "gpu2"}
    for row in rows.values():
        findings = row["document"]["findings"]
        assert findings, row
        assert row["exit_code"] == (0 if row["document"]["ok"] else 1)
        assert f"{sum(f['result'] == 'ok' for f in findings)} ok" in row["summary"]
    assert result.exit_code == (0 if all(row["ok"] for row in rows.values()) else 1)


def test_patch_verify_of_two_hosts_reports_each_hosts_sets(many: Cli) -> None:
    result = many("patch", "verify", "--hosts", "gpu1,gpu2", "--json", timeout=180)
    rows = rows_by_host(result.json())
    assert set(rows) == {"gpu1", "gpu2"}
    for row in rows.values():
        assert "sets" in row["document"], row
        names = [entry["name"] for entry in row["document"]["sets"]]
        assert all(name in row["summary"] for name in names)


def test_a_change_is_made_one_host_at_a_time(many: Cli, tmp_path: Path) -> None:
    result = many("patch", "apply", "--hosts", "gpu1,gpu2")
    assert result.exit_code == 2
    assert "patch apply: one host at a time (--host)" in result.stderr
    assert not (tmp_path / "gpu1-workdir").exists()  # refused before any host was touched


def test_status_of_two_hosts_shows_each_hosts_jobs(many: Cli) -> None:
    launched = many("run", "--host", "gpu1", "--name", "hello", "--", "echo", "hi")
    assert launched.exit_code == 0, launched.stderr
    result = many("status", "--hosts", "gpu1,gpu2", "--json")
    assert result.exit_code == 0, result.stderr
    rows = rows_by_host(result.json())
    assert [job["name"] for job in rows["gpu1"]["document"]["jobs"]] == ["hello"]
    assert rows["gpu1"]["summary"] == "1 succeeded"
    assert rows["gpu2"]["summary"] == "no jobs"
    assert result.json()["total_eta_s"] is None  # nothing running


@pytest.mark.parametrize(("flags", "message"), [
    (["--host", "gpu1", "--hosts", "gpu1,gpu2"], "--host and --hosts/--all exclude each other"),
    (["--hosts", "gpu1,nope"], "hosts: no host named 'nope'"),
    (["--hosts", "gpu1,,gpu2"], "--hosts: 'gpu1,,gpu2' has an empty name"),
    (["--hosts", "gpu1,gpu1"], "--hosts: 'gpu1' is named twice"),
])
def test_a_bad_host_list_is_one_line_and_exit_2(many: Cli, flags: list[str], message: str) -> None:
    result = many("check", *flags)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
