"""A job on a CPU host runs with thread pools as large as its cores and passive waiting, recorded in its
record; what the launch or the agent's environment already sets wins."""

from __future__ import annotations

import json
import os
from pathlib import Path

from specops.jobs.threads import cgroup_cpu_quota, cpu_job_environment, thread_environment
from tests.support.agent import Agent, python_job

SHOW_THREADS = python_job("import json, os; print(json.dumps({key: os.environ.get(key) for key in "
                          "('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'OMP_WAIT_POLICY', "
                          "'KMP_BLOCKTIME')}))")


def test_a_cpu_job_records_its_cores_and_runs_with_matching_thread_pools(agent: Agent) -> None:
    job = agent.launch("train", SHOW_THREADS, "--env", "KMP_BLOCKTIME=50")
    done = agent.wait_for_state(job["id"])
    assert done["state"] == "succeeded", Path(done["log"]).read_text()
    threads = done["threads"]
    assert 1 <= threads["cores"] <= threads["affinity"] <= (os.cpu_count() or 1)
    cores = str(threads["cores"])
    # The test agents inherit OMP_NUM_THREADS=1 (tests/support/agent.py): that choice is kept, not replaced.
    assert threads["env"] == {"MKL_NUM_THREADS": cores, "OPENBLAS_NUM_THREADS": cores, "NUMEXPR_NUM_THREADS": cores,
                              "OMP_WAIT_POLICY": "PASSIVE"}
    seen = json.loads(Path(done["log"]).read_text())
    assert seen == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": cores, "OPENBLAS_NUM_THREADS": cores,
                    "OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "50"}
    assert done["env"] == {"KMP_BLOCKTIME": "50"}


def test_what_the_launch_or_its_environment_sets_is_not_overridden() -> None:
    added = cpu_job_environment({"OMP_WAIT_POLICY": "ACTIVE"}, {"OMP_NUM_THREADS": "7", "PATH": "/bin"})
    assert "OMP_WAIT_POLICY" not in added and "OMP_NUM_THREADS" not in added
    assert added["KMP_BLOCKTIME"] == "0" and added["MKL_NUM_THREADS"].isdigit()


def test_pools_match_the_cores_given() -> None:
    assert thread_environment(3) == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "3",
                                     "NUMEXPR_NUM_THREADS": "3", "OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}


def test_the_tightest_cgroup_v2_quota_up_the_tree_counts(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    (root / "jobs" / "one").mkdir(parents=True)
    (root / "cpu.max").write_text("max 100000\n")
    (root / "jobs" / "cpu.max").write_text("150000 100000\n")
    (root / "jobs" / "one" / "cpu.max").write_text("max 100000\n")
    proc = tmp_path / "cgroup-of-self"
    proc.write_text("0::/jobs/one\n")
    assert cgroup_cpu_quota(proc, root) == 1.5
    (root / "jobs" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(proc, root) is None


def test_a_cgroup_v1_cfs_quota_counts_and_minus_one_is_unlimited(tmp_path: Path) -> None:
    folder = tmp_path / "cgroup" / "cpu,cpuacct" / "box"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("50000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "cgroup-of-self"
    proc.write_text("4:memory:/box\n2:cpu,cpuacct:/box\n0::/\n")
    assert cgroup_cpu_quota(proc, tmp_path / "cgroup") == 0.5
    (folder / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(proc, tmp_path / "cgroup") is None
