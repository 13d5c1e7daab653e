"""A private tmux server per workdir, addressed with exact session targets.

`-L` names a socket under tmux's own directory, which stays short (a `-S` path under a deep
workdir can pass the 108-byte limit of a unix socket). `-f /dev/null` keeps the user's tmux.conf
out. Targets are always `=name`: a bare name matches prefixes and patterns ('extract' would
match 'extract-2').
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from specops.contract.errors import CheckFailed

_TIMEOUT_S = 30
# A server whose last session just ended is exiting; a client that reached it then gets this answer.
# The next attempt starts a fresh server.
_SERVER_GONE = "server exited unexpectedly"
_NEW_SESSION_ATTEMPTS = 5
_RETRY_PAUSE_S = 0.05  # times the attempt: a loaded host takes longer to finish the exit


def server_name(workdir: Path) -> str:
    return "specops-" + hashlib.sha256(str(workdir).encode()).hexdigest()[:12]


class TmuxServer:
    def __init__(self, workdir: Path) -> None:
        self.name = server_name(workdir)

    def argv(self, *args: str) -> list[str]:
        return ["tmux", "-L", self.name, "-f", "/dev/null", *args]

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        # Outside any enclosing tmux, so tmux never refuses to nest.
        env = {key: value for key, value in os.environ.items() if key not in ("TMUX", "TMUX_PANE")}
        try:
            return subprocess.run(self.argv(*args), capture_output=True, text=True, env=env,
                                  stdin=subprocess.DEVNULL, timeout=_TIMEOUT_S)
        except FileNotFoundError:
            raise CheckFailed("tmux is not installed on this host (needed to run jobs)") from None

    def has_session(self, session: str) -> bool:
        return self._run("has-session", "-t", f"={session}").returncode == 0

    def new_session(self, session: str, cwd: str, argv: Sequence[str]) -> None:
        """Start `argv` detached. With two or more arguments tmux execs them directly, no shell."""
        if len(argv) < 2:
            raise ValueError("tmux runs a single argument through a shell; pass at least two")
        for attempt in range(1, _NEW_SESSION_ATTEMPTS + 1):
            result = self._run("new-session", "-d", "-s", session, "-c", cwd, "-x", "200", "-y", "50", *argv)
            # a launch right after the server's last job ended races the server's exit: try again
            if result.returncode == 0 or _SERVER_GONE not in result.stderr or attempt == _NEW_SESSION_ATTEMPTS:
                break
            time.sleep(_RETRY_PAUSE_S * attempt)
        if result.returncode != 0:
            raise CheckFailed(f"tmux new-session {session!r} failed: {result.stderr.strip()}")

    def kill_session(self, session: str) -> bool:
        return self._run("kill-session", "-t", f"={session}").returncode == 0

    def kill_server(self) -> None:
        self._run("kill-server")
