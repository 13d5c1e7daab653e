"""Drive the host agent's `job` commands as the control side does: `python -m specops job ...` in a
subprocess, with SPECOPS_WORKDIR pointing at a private workdir (and so a private tmux server)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

SRC = Path(__file__).resolve().parents[2] / "src"
PYTHON = sys.executable  # the checkout's .venv, as on a test host
ENDED = ("succeeded", "failed", "stopped", "lost")

T = TypeVar("T")


def wait_until(probe: Callable[[], T], timeout_s: float = 30.0, what: str = "condition") -> T:
    """Poll `probe` until it returns something truthy; fail the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
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
    workdir: Path

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("SPECOPS_", "TMUX"))}
        env.update(SPECOPS_WORKDIR=str(self.workdir), PYTHONPATH=str(SRC), **(extra or {}))
        return env

    def argv(self, *args: str) -> list[str]:
        return [PYTHON, "-m", "specops", "job", *args]

    def call(self, *args: str, agent_env: dict[str, str] | None = None, timeout_s: float = 60) -> tuple[int, dict]:
        """Run one command; its exit code and its one JSON document."""
        proc = subprocess.run(self.argv(*args), cwd=self.workdir, env=self.env(agent_env), capture_output=True,
                              text=True, timeout=timeout_s)
        lines = proc.stdout.splitlines()
        assert len(lines) == 1, f"expected one JSON line, got {proc.stdout!r} (stderr {proc.stderr!r})"
        return proc.returncode, json.loads(lines[0])

    def ok(self, *args: str, **kwargs: Any) -> dict:
        code, document = self.call(*args, **kwargs)
        assert code == 0 and document["ok"] is True, document
        return document

    def json_lines(self, *args: str, timeout_s: float = 60) -> tuple[int, list[dict]]:
        proc = subprocess.run(self.argv(*args), cwd=self.workdir, env=self.env(), capture_output=True, text=True,
                              timeout=timeout_s)
        return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()]

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(*args), cwd=self.workdir, env=self.env(), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def launch(self, name: str, command: list[str], *options: str, agent_env: dict[str, str] | None = None) -> dict:
        return self.ok("launch", "--name", name, *options, "--", *command, agent_env=agent_env)["job"]

    def show(self, reference: str) -> dict:
        return self.ok("show", reference)["job"]

    def wait_for_state(self, reference: str, states: tuple[str, ...] = ENDED, timeout_s: float = 30) -> dict:
        return wait_until(lambda: (job := self.show(reference))["state"] in states and job,
                          timeout_s, f"job {reference} to reach {states}")

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
