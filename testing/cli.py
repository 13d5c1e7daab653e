"""Drive the real `invoke` tasks as a user would: a subprocess in the repository root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testing.repo import REPO

INVOKE = Path(sys.executable).parent / "invoke"


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def write_inventory(path: Path, hosts: dict[str, dict], default: str) -> Path:
    path.write_text(yaml.safe_dump({"default": default, "hosts": hosts}, sort_keys=False))
    return path


class Cli:
    """Runs `invoke ...` with a given inventory and a private logs folder."""

    def __init__(self, inventory: Path, logs: Path) -> None:
        self.inventory, self.logs = inventory, logs

    def env(self, **extra: str) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("SPECOPS_")}
        env.update(SPECOPS_INVENTORY=str(self.inventory), SPECOPS_LOGS=str(self.logs), NO_COLOR="1", **extra)
        return env

    def __call__(self, *args: str, timeout: float = 120, **extra_env: str) -> CliResult:
        proc = subprocess.run([str(INVOKE), *args], cwd=REPO, env=self.env(**extra_env), capture_output=True,
                              text=True, timeout=timeout)
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    def popen(self, *args: str, merge_streams: bool = False, **extra_env: str) -> subprocess.Popen:
        """`merge_streams`: stderr into the stdout pipe, in the order written (read it from `.stdout`)."""
        return subprocess.Popen([str(INVOKE), *args], cwd=REPO, env=self.env(**extra_env), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge_streams else subprocess.PIPE)
