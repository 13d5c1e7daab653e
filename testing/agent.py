"""Run the host agent as the control side does: `python -m specops ...` in a subprocess, on a workdir.

The one helper every test directory uses. The agent gets a private workdir (SPECOPS_WORKDIR, hence
a private tmux server), this checkout's src/ behind any site folders a test puts first (a
"host" with other packages installed), one torch thread and no hub. `Agent` adds the `job`
commands and leaves nothing running behind it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from specops.contract.protocol import TERMINAL_STATES
from testing.repo import REPO, SRC

__all__ = ["REPO", "SRC", "Agent", "agent_env", "group_alive", "python_job", "run_agent", "start_agent", "wait_until"]

PYTHON = sys.executable  # the checkout's .venv, as on a test host
QUIET = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}

T = TypeVar("T")


def agent_env(workdir: Path, *, sites: Sequence[Path | str] = (), extra: Mapping[str, str] | None = None,
              isolated: bool = False) -> dict[str, str]:
    """This process's environment for an agent on `workdir`, with PYTHONPATH = sites, then src/.
    `isolated` drops SPECOPS_* and TMUX* variables first, as a fresh login on a host would."""
    env = {key: value for key, value in os.environ.items()
           if not (isolated and key.startswith(("SPECOPS_", "TMUX")))}
    env.update(QUIET, SPECOPS_WORKDIR=str(workdir), PYTHONPATH=os.pathsep.join([*map(str, sites), str(SRC)]))
    env.update(extra or {})
    return env


def agent_argv(*args: str, python: Path | str = PYTHON) -> list[str]:
    return [str(python), "-m", "specops", *args]


def one_document(stdout: str, stderr: str = "") -> dict[str, Any]:
    """The agent's one JSON document; anything else on stdout fails the test."""
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, f"expected one JSON line on stdout, got {stdout!r}\n{stderr[-3000:]}"
    return json.loads(lines[0])


def run_agent(workdir: Path, *args: str, sites: Sequence[Path | str] = (), env: Mapping[str, str] | None = None,
              python: Path | str = PYTHON, timeout: float = 300, isolated: bool = False) -> tuple[int, dict, str]:
    """Run `python -m specops ARGS` on the workdir: (exit code, the JSON document, stderr)."""
    done = subprocess.run(agent_argv(*args, python=python), cwd=workdir, capture_output=True, text=True,
                          env=agent_env(workdir, sites=sites, extra=env, isolated=isolated), timeout=timeout)
    return done.returncode, one_document(done.stdout, done.stderr), done.stderr


def start_agent(workdir: Path, *args: str, sites: Sequence[Path | str] = (), env: Mapping[str, str] | None = None,
                python: Path | str = PYTHON, isolated: bool = False, **popen: Any) -> subprocess.Popen:
    """The agent as a running process (stdout and stderr piped unless given)."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(agent_argv(*args, python=python), cwd=workdir,
                            env=agent_env(workdir, sites=sites, extra=env, isolated=isolated), **popen)


def wait_until(probe: Callable[[], T], timeout_s: float = 30.0, what: str | Callable[[], str] = "condition") -> T:
    """Poll `probe` until it returns something truthy; fail the test after `timeout_s`, saying `what`
    (a callable is asked then: what the wait had reached)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what() if callable(what) else what}")
        time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def python_job(source: str, *args: str) -> list[str]:
    """A job command that runs a Python snippet with arguments (no shell involved)."""
    return [PYTHON, "-c", source, *args]


@dataclass
class Agent:
    """The agent's `job` commands on one workdir, in an isolated environment."""

    workdir: Path
    sites: Sequence[Path | str] = field(default_factory=tuple)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return agent_env(self.workdir, sites=self.sites, extra=extra, isolated=True)

    def argv(self, *args: str) -> list[str]:
        return agent_argv("job", *args)

    def call(self, *args: str, agent_env: dict[str, str] | None = None, timeout_s: float = 60) -> tuple[int, dict]:
        """Run one command; its exit code and its one JSON document."""
        code, document, _ = run_agent(self.workdir, "job", *args, sites=self.sites, env=agent_env, isolated=True,
                                      timeout=timeout_s)
        return code, document

    def ok(self, *args: str, **kwargs: Any) -> dict:
        code, document = self.call(*args, **kwargs)
        assert code == 0 and document["ok"] is True, document
        return document

    def json_lines(self, *args: str, timeout_s: float = 60) -> tuple[int, list[dict]]:
        proc = subprocess.run(self.argv(*args), cwd=self.workdir, env=self.env(), capture_output=True, text=True,
                              timeout=timeout_s)
        return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()]

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return start_agent(self.workdir, "job", *args, sites=self.sites, isolated=True, text=True)

    def launch(self, name: str, command: list[str], *options: str, agent_env: dict[str, str] | None = None) -> dict:
        return self.ok("launch", "--name", name, *options, "--", *command, agent_env=agent_env)["job"]

    def show(self, reference: str) -> dict:
        return self.ok("show", reference)["job"]

    def wait_for_state(self, reference: str, states: Sequence[str] = tuple(TERMINAL_STATES),
                       timeout_s: float = 30) -> dict:
        return wait_until(lambda: (job := self.show(reference))["state"] in states and job,
                          timeout_s, f"job {reference} to reach {sorted(states)}")

    def wait_for_log(self, job: dict, text: str, timeout_s: float = 30) -> str:
        # Bytes decoded as they are: read_text() would turn a '\r' into '\n'.
        return wait_until(lambda: text in (log := Path(job["log"]).read_bytes().decode()) and log,
                          timeout_s, f"{text!r} in the log of {job['id']}")

    def record_on_disk(self, job_id: str) -> dict:
        return json.loads((self.workdir / "state" / "jobs" / f"{job_id}.json").read_text())

    def records_on_disk(self) -> list[dict]:
        folder = self.workdir / "state" / "jobs"
        return [json.loads(path.read_text()) for path in folder.glob("*.json")
                if not path.name.endswith(".environ.json")]

    def tmux(self, server: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", "-L", server, "-f", "/dev/null", *args], capture_output=True, text=True,
                              timeout=30)

    def clean_up(self) -> None:
        """Leave nothing running: every job's process group, then every tmux server it used."""
        records = self.records_on_disk() if (self.workdir / "state" / "jobs").exists() else []
        for record in records:
            if record.get("pgid") and group_alive(record["pgid"]):
                os.killpg(record["pgid"], signal.SIGKILL)
        for server in {record["tmux_server"] for record in records}:
            self.tmux(server, "kill-server")
            # tmux 3.3 leaves the socket file behind; one per test would pile up.
            socket = Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}" / server
            socket.unlink(missing_ok=True)
