"""Start-up stays lean: listing the tasks, or a task that needs no network, imports no SSH, table or
validation library. Checked by what a fresh interpreter has in sys.modules, never by a clock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.cli import INVOKE, Cli
from tests.support.repo import REPO

HEAVY = ("paramiko", "fabric", "rich", "pydantic", "pydantic_core", "cryptography", "importlib.metadata")

# Runs the invoke CLI in this interpreter, then writes every module it imported to argv[1].
IN_PROCESS_CLI = """
import atexit, json, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
from invoke.main import program
program.run(["invoke", *sys.argv[2:]], exit=True)
"""


def heavy_in(modules: list[str]) -> list[str]:
    return sorted(name for name in modules if name.split(".")[0] in HEAVY or name in HEAVY)


def test_importing_tasks_imports_no_ssh_table_or_validation_library() -> None:
    proc = subprocess.run([sys.executable, "-c", "import json, sys, tasks; print(json.dumps(sorted(sys.modules)))"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    modules = json.loads(proc.stdout)
    assert "tasks" in modules and "remote.tasks.core" in modules
    assert heavy_in(modules) == []


def test_importing_tasks_loads_only_the_task_faces() -> None:
    # compat's wheel cache (zipfile, shutil), the inventory and thread pools load inside their tasks
    proc = subprocess.run([sys.executable, "-c", "import json, sys, tasks; print(json.dumps(sorted(sys.modules)))"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    modules = set(json.loads(proc.stdout))
    for later in ("remote.inventory", "remote.wheel_cache", "remote.agent", "remote.ssh", "zipfile",
                  "concurrent.futures.thread"):
        assert later not in modules, later


def test_the_agents_job_list_imports_only_what_listing_needs(tmp_path: Path) -> None:
    # `invoke status` waits for this command on the host: no launch, stop, tail or wrapper code
    probe = ("import json, sys; from specops.cli import main; sys.argv = ['specops', 'job', 'list']; main(); "
             "print(json.dumps(sorted(sys.modules)))")
    env = {"PATH": "/usr/bin:/bin", "SPECOPS_WORKDIR": str(tmp_path), "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    listed, modules = (json.loads(line) for line in proc.stdout.splitlines()[-2:])
    assert listed["ok"] is True and listed["jobs"] == []
    for later in ("specops.jobs.launching", "specops.jobs.stopping", "specops.jobs.wrapper", "secrets", "dataclasses"):
        assert later not in modules, later


def test_a_task_without_network_imports_no_ssh_or_validation_library(cli: Cli, tmp_path: Path) -> None:
    listing = tmp_path / "modules.json"
    proc = subprocess.run([sys.executable, "-c", IN_PROCESS_CLI, str(listing), "hosts", "--json"], cwd=REPO,
                          env=cli.env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert {host["name"] for host in json.loads(proc.stdout)["hosts"]} == {"local", "loop"}
    modules = json.loads(listing.read_text())
    assert "remote.inventory" in modules
    assert heavy_in(modules) == []


def test_the_listing_and_help_stay_complete_with_lazy_imports(cli: Cli) -> None:
    listing = cli("--list")
    assert listing.exit_code == 0
    for name in ("hosts", "check", "sync", "status", "logs", "stop", "fetch", "extract", "pipeline", "doctor",
                 "patch", "prepare", "validate", "vocab", "train", "run"):
        assert name in listing.stdout, name
    helped = cli("--help", "sync")
    assert helped.exit_code == 0
    assert "--dry-run" in helped.stdout and "--sftp" in helped.stdout


def test_tasks_keep_bytecode_caches_unless_the_user_says_no(cli: Cli, tmp_path: Path) -> None:
    # Invoke turns bytecode writing off by default: without this, every task compiled our modules again
    env = {key: value for key, value in cli.env().items() if key != "PYTHONDONTWRITEBYTECODE"}
    cached, refused = tmp_path / "cached", tmp_path / "refused"
    for prefix, extra in ((cached, {}), (refused, {"PYTHONDONTWRITEBYTECODE": "1"})):
        proc = subprocess.run([str(INVOKE), "hosts", "--json"], cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**env, "PYTHONPYCACHEPREFIX": str(prefix), **extra})
        assert proc.returncode == 0, proc.stderr
    assert any(cached.rglob("core.cpython-*.pyc")) and any(cached.rglob("inventory.cpython-*.pyc"))
    assert not refused.exists() or not any(refused.rglob("*.pyc"))


# Runs the agent as `python -m specops` does, then writes the collector's state at exit to argv[1].
AGENT_AT_EXIT = """
import atexit, gc, json, runpy, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps({"thresholds": gc.get_threshold(),
                                                         "frozen": gc.get_freeze_count()})))
sys.argv = ["specops", *sys.argv[2:]]
runpy.run_module("specops", run_name="__main__")
"""


def test_the_agent_collects_rarely_and_leaves_nothing_for_the_collector_at_exit(tmp_path: Path) -> None:
    from specops import collector

    out = tmp_path / "collector.json"
    proc = subprocess.run([sys.executable, "-c", AGENT_AT_EXIT, str(out), "job", "list"], cwd=tmp_path,
                          env={**os.environ, "SPECOPS_WORKDIR": str(tmp_path)}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True  # the command ran as usual
    state = json.loads(out.read_text())
    assert tuple(state["thresholds"]) == collector.THRESHOLDS
    assert state["frozen"] > 10_000  # every object alive when the command ended
