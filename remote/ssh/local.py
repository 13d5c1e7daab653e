"""The `local` host: commands run through `bash -c`, exactly as sshd would run them."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from remote.errors import ConnectError
from remote.ssh.command import READ_CHUNK, CommandResult, pump, shell_command

if TYPE_CHECKING:
    from remote.inventory import Host


class LocalConnection:
    """This machine, behind the same interface as an SSH host (so `local` exercises the same path)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.round_trips = 0

    def run(self, argv, *, cwd=None, env=None, stdin=None, timeout=None) -> CommandResult:
        self.round_trips += 1
        try:
            proc = subprocess.run(["bash", "-c", shell_command(argv, cwd, env)], input=stdin or b"",
                                  capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:  # the same one line as an SSH host's (remote.ssh.liveness)
            raise ConnectError(f"{self.host.name} (local): the command did not finish within {timeout:g} s") from None
        return CommandResult(proc.returncode, proc.stdout, proc.stderr)

    def stream(self, argv, *, on_stdout, on_stderr=None, cwd=None, env=None, timeout=None) -> int:
        self.round_trips += 1
        proc = subprocess.Popen(["bash", "-c", shell_command(argv, cwd, env)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        err_thread = threading.Thread(target=pump, args=(proc.stderr, on_stderr), daemon=True)
        err_thread.start()
        try:
            while chunk := proc.stdout.read1(READ_CHUNK):  # type: ignore[attr-defined]
                on_stdout(chunk)
            return proc.wait()
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
            err_thread.join(timeout=1)

    def download(self, remote_path: str, local_path: Path) -> None:
        shutil.copyfile(remote_path, local_path)

    def upload(self, data: bytes, remote_path: str) -> None:
        target = Path(remote_path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        except OSError as exc:
            raise ConnectError(f"{self.host.name} (local): upload to {remote_path} failed: {exc}") from None

    def close(self) -> None:
        pass

    def __enter__(self) -> LocalConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
