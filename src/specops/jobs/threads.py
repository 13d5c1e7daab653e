"""Thread settings for a job on a CPU host, from the cores the job really gets.

OpenMP (torch's intra-op pool, MKL, OpenBLAS) sizes its pools from the machine's CPU count and, by
default, spins while waiting at each barrier. On a shared CPU host both go wrong: a process limited
by its affinity mask or a cgroup quota runs more threads than it has cores, and spinning threads
burn the time slices their siblings need, so every parallel region waits on a descheduled thread.
A job on a CPU host therefore gets pools as large as its cores and passive waiting, unless the
launch (or the agent's own environment) already says otherwise. Standard library only.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# Pool sizes read by torch (intra-op, via OpenMP), MKL, OpenBLAS and numexpr.
POOL_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
# Sleep, do not spin, at barriers: GNU OpenMP (torch's CPU wheels) and Intel OpenMP.
WAIT_VARIABLES = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}


def _cgroup_v2_quota(root: Path, cgroup_path: str) -> float | None:
    """The tightest cpu.max quota (in cores) from this cgroup up to the root, or None without one."""
    tightest: float | None = None
    folder = root / cgroup_path.lstrip("/")
    while True:
        try:
            quota, period = (folder / "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            quota, period = "max", "1"
        if quota != "max" and float(period) > 0:
            cores = float(quota) / float(period)
            tightest = cores if tightest is None else min(tightest, cores)
        if folder == root or root not in folder.parents:
            return tightest
        folder = folder.parent


def _cgroup_v1_quota(root: Path, cgroup_path: str) -> float | None:
    for controller in ("cpu,cpuacct", "cpu"):
        folder = root / controller / cgroup_path.lstrip("/")
        try:
            quota = int((folder / "cpu.cfs_quota_us").read_text())
            period = int((folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return quota / period if quota > 0 and period > 0 else None
    return None


def cgroup_cpu_quota(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> float | None:
    """This process's CPU quota in cores (cgroup v2 cpu.max, or v1 cfs quota), None when unlimited."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float | None] = []
    for line in lines:  # a hybrid host lists both hierarchies: the tighter quota wins
        hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
        if hierarchy == "0" and controllers == "":
            quotas.append(_cgroup_v2_quota(root, path))
        elif "cpu" in controllers.split(","):
            quotas.append(_cgroup_v1_quota(root, path))
    found = [quota for quota in quotas if quota is not None]
    return min(found) if found else None


def usable_cores() -> dict[str, object]:
    """The cores this process may run on: its affinity mask, capped by its cgroup's CPU quota."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota()
    cores = affinity if quota is None else max(1, min(affinity, math.floor(quota)))
    return {"cores": cores, "affinity": affinity, "cgroup_quota": quota, "cpu_count": os.cpu_count()}


def thread_environment(cores: int) -> dict[str, str]:
    """Pools of `cores` threads that sleep at barriers."""
    return {**dict.fromkeys(POOL_VARIABLES, str(cores)), **WAIT_VARIABLES}


def cpu_job_environment(explicit: Mapping[str, str], inherited: Mapping[str, str]) -> dict[str, str]:
    """What a CPU job's record adds to its environment: the thread settings that neither the launch's
    explicit env nor the environment it inherits already sets (a user's choice wins)."""
    wanted = thread_environment(int(usable_cores()["cores"]))  # type: ignore[call-overload]
    return {key: value for key, value in wanted.items() if key not in explicit and key not in inherited}
