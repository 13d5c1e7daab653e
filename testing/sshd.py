"""A throwaway OpenSSH server on 127.0.0.1 for tests: its own host key, client key and config.

Started with `sshd -D -e -f CONFIG` (no daemonising, log to stderr), waited for until the port
accepts connections, and torn down by killing its per-connection children and itself by PID.

A clean login by default: the server stands in for a GPU host, not for the machine the tests run on.
bash sources ~/.bashrc for every command sshd hands it (Debian builds bash so), and root's ~/.bashrc
on this workplace's machines runs `pyenv init` there: ~0.1 s of CPU and ~50 processes per remote
command, the most of a command through a shared master (measured: 116 ms against 6.5 ms), paid by
every remote command of every test. Debian's own ~/.bashrc returns at once for a non-interactive shell, as a host's
usually does. `SetEnv SHLVL=1` makes the command's bash a nested shell (level 2), which bash never
hands the rc file; nothing else of the login changes (user, home, PATH from sshd, the real shell).
The benches that measure a login's cost ask for the workstation's own (`clean_login=False`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def two_free_ports() -> int:
    """P with P and P+1 free: node i of a run across loopback hosts serves on vllm.port + i."""
    while True:
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


def keygen(path: Path, comment: str) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)


@dataclass
class SshServer:
    root: Path
    port: int
    host_key: Path
    client_key: Path
    process: subprocess.Popen | None = None
    clean_login: bool = True  # see the module docstring: the command's bash skips ~/.bashrc
    environment: dict[str, str] | None = None  # set for every command (sshd's SetEnv), as a host's profile would

    @property
    def user(self) -> str:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name

    def known_hosts_line(self) -> str:
        key_type, key_b64 = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {key_type} {key_b64}\n"

    def write_config(self) -> Path:
        config = self.root / "sshd_config"
        authorized = self.root / "authorized_keys"
        authorized.write_text(self.client_key.with_suffix(".pub").read_text())
        authorized.chmod(0o600)
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.host_key}\n"
            f"PidFile {self.root / 'sshd.pid'}\nAuthorizedKeysFile {authorized}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
            "UsePAM no\nPermitRootLogin yes\nStrictModes no\nSubsystem sftp internal-sftp\n"
            "AcceptEnv LANG LC_*\nPrintMotd no\nLogLevel INFO\nMaxStartups 100\nMaxSessions 100\n"
            "ClientAliveInterval 0\n" + self._set_env())
        return config

    def _set_env(self) -> str:
        """sshd's SetEnv line: SHLVL for a clean login, then `environment`; nothing when both are empty."""
        variables = {**({"SHLVL": "1"} if self.clean_login else {}), **(self.environment or {})}
        if not variables:
            return ""
        return "SetEnv " + " ".join(f"{name}={value}" for name, value in variables.items()) + "\n"

    def start(self) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir, needed as root
        config = self.write_config()
        log = self.log.open("ab")
        self.process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=log,
                                        stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.root / 'sshd.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    if sock.recv(64).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.01)
        raise RuntimeError("sshd did not start listening within 10 s")

    @property
    def log(self) -> Path:
        return self.root / "sshd.log"

    def logins(self) -> int:
        """SSH connections the server has authenticated so far: sshd (-e, LogLevel INFO) logs one
        `Accepted publickey for USER from ADDRESS port N` line for each."""
        return self.log.read_text(errors="replace").count("Accepted publickey for ")

    def connection_children(self) -> list[int]:
        """PIDs of the per-connection sshd processes (children of the listener)."""
        if self.process is None:
            return []
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        try:
            return [int(pid) for pid in children.read_text().split()]
        except FileNotFoundError:
            return []

    def drop_connections(self) -> int:
        """Kill every live SSH connection, as a network drop or server restart would."""
        pids = self.connection_children()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def stop(self) -> None:
        self.drop_connections()
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_sshd(root: Path, *, clean_login: bool = True, environment: dict[str, str] | None = None) -> SshServer:
    root.mkdir(parents=True, exist_ok=True)
    host_key, client_key = root / "host_ed25519", root / "client_ed25519"
    keygen(host_key, "specops-test-host")
    keygen(client_key, "specops-test-client")
    server = SshServer(root=root, port=free_port(), host_key=host_key, client_key=client_key,
                       clean_login=clean_login, environment=environment)
    server.start()
    return server
