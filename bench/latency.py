"""Latency of one specops command over SSH, against what SSH itself costs, side by side in one run.

    .venv/bin/python bench/latency.py [--n 5] [--before PATH] [--no-bytecode]

Starts a throwaway sshd on 127.0.0.1 (testing/sshd.py), writes an inventory with the SSH host
and a local host, and times, after one warm-up each, N rounds of all of these in turn (median and p90 in ms):

  ssh true          OpenSSH client, `ssh -o BatchMode=yes host true`, the same key: the floor
  bare (process)    a fresh python: import the SSH layer, connect, run `true` (no invoke, no agent)
  bare (in-proc)    connect + `true` in this process (imports already paid), TCP_NODELAY on and off
  agent (in-proc)   connect + one agent call (`job list`) in this process, TCP_NODELAY on and off
  invoke --list / hosts   the CLI with no SSH at all: interpreter, invoke and imports
  check / status / patch status   the full task, `invoke ... --host H --json`, with its round trips;
                    status three ways: through a shared OpenSSH master that is up (the usual case
                    after the first quick task or a sync), opening a master (a control folder of
                    its own each time), and without sharing (SPECOPS_SSH_PERSIST=0: fabric)

With --before PATH (another checkout, e.g. `git worktree add ../before <commit>`), the process rows
(bare process, the invoke tasks) are timed for that tree too, interleaved with this one's, against
hosts of their own (own workdirs), and an after/before ratio per row is printed. Each tree runs with
its own src/ first on PYTHONPATH. Bytecode caches are written and reused as for a user;
--no-bytecode sets PYTHONDONTWRITEBYTECODE=1 (as some sandboxes do: every run then compiles the
checkout's own modules, the installed packages keep their caches).

twice: as root, whose ~/.bashrc runs `pyenv init` for every SSH command, and as a throwaway user
with an empty ~/.bashrc (a clean login shell; created here and removed at the end). Ratios are
against `ssh true` of the same login. Needs root (useradd); without it the clean-login rows are
skipped. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pwd
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from remote.agent import agent_call, forget_current  # noqa: E402
from remote.inventory import load_inventory  # noqa: E402
from remote.ssh import connection as connection_module  # noqa: E402
from remote.ssh import open_connection  # noqa: E402
from testing.cli import INVOKE, write_inventory  # noqa: E402
from testing.sshd import SshServer, start_sshd  # noqa: E402

PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").exists() else sys.executable
# The SSH hosts' env: one any user can run (the .venv's interpreter lives under root's 0700 home), the
# same for both logins so that only the login shell differs. The agent commands timed need no packages.
HOST_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else PYTHON


@dataclass
class Row:
    name: str
    login: str
    tree: str = "this"
    times: list[float] = field(default_factory=list)
    round_trips: int | None = None

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times) * 1000

    @property
    def p90_ms(self) -> float:
        if len(self.times) < 2:
            return self.times[0] * 1000
        return statistics.quantiles(self.times, n=10, method="inclusive")[8] * 1000


def run_checked(argv: list[str], env: dict[str, str] | None = None,
                cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:4]}... exited {proc.returncode}: {proc.stderr.strip()[-600:]}")
    return proc


@contextmanager
def nagle(on: bool) -> Iterator[None]:
    """Leave Nagle on in remote.ssh.connection without editing it: its TCP_NODELAY request is redirected.

    remote.ssh.connection calls sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1) through its
    module-global `socket`; a stand-in whose two constants name SO_KEEPALIVE turns that call into a
    harmless keepalive switch. The socket option actually in effect is read back and printed.
    """
    if not on:
        yield
        return
    names = [name for name in dir(socket) if not name.startswith("__")]
    stand_in = types.SimpleNamespace(**{name: getattr(socket, name) for name in names})
    stand_in.IPPROTO_TCP, stand_in.TCP_NODELAY = socket.SOL_SOCKET, socket.SO_KEEPALIVE
    real = connection_module.socket
    connection_module.socket = stand_in  # type: ignore[assignment]
    try:
        yield
    finally:
        connection_module.socket = real


def nodelay_in_effect(conn: connection_module.SSHConnection) -> bool:
    transport = conn.fabric.transport
    assert transport is not None
    return bool(transport.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


@dataclass
class Login:
    label: str
    user: str
    workdir: Path


def make_clean_user(root: Path) -> Login | None:
    """A throwaway user with an empty ~/.bashrc: a login shell that does nothing per command."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        return None
    name = f"spbench{os.getpid()}"
    home = root / name
    # Password "*": no password login, but not a locked account (sshd refuses those without PAM).
    subprocess.run(["useradd", "--password", "*", "--home-dir", str(home), "--create-home", "--shell", "/bin/bash",
                    name], check=True, capture_output=True)
    for rc in (".bashrc", ".profile", ".bash_profile"):
        (home / rc).write_text("")
    workdir = home / "workdir"
    workdir.mkdir()
    entry = pwd.getpwnam(name)
    for path in (home, workdir, *(home / rc for rc in (".bashrc", ".profile", ".bash_profile"))):
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return Login("clean login", name, workdir)


def remove_user(login: Login | None) -> None:
    """userdel refuses while the user's last session processes are still exiting: retry for a while."""
    if login is None:
        return
    deadline = time.monotonic() + 10
    while True:
        proc = subprocess.run(["userdel", "--remove", login.user], capture_output=True, text=True)
        if proc.returncode in (0, 6) or login.user not in Path("/etc/passwd").read_text():
            return
        if time.monotonic() > deadline:
            print(f"bench: could not remove user {login.user}: {proc.stderr.strip()}", file=sys.stderr)
            return
        time.sleep(0.2)


def ssh_argv(server: SshServer, known_hosts: Path, user: str, *command: str) -> list[str]:
    return ["ssh", "-F", "/dev/null", "-p", str(server.port), "-i", str(server.client_key), "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
            f"{user}@127.0.0.1", *command]


# The SSH layer's module: remote.ssh now, remote.connection before the move to fabric.
BARE_PROCESS = """
import importlib, importlib.util, sys
sys.path.insert(0, sys.argv[1])
from remote.inventory import load_inventory
layer = "remote.ssh" if importlib.util.find_spec("remote.ssh") else "remote.connection"
open_connection = importlib.import_module(layer).open_connection
host = load_inventory().host(sys.argv[2])
with open_connection(host) as conn:
    assert conn.run(["true"]).exit_code == 0
"""


def tree_env(env: dict[str, str], tree: Path) -> dict[str, str]:
    return {**env, "PYTHONPATH": f"{tree / 'src'}:{tree}"}


def process_measurements(login: Login, host: str, env: dict[str, str], tree: Path,
                         label: str) -> list[tuple[Row, Callable[[], object]]]:
    """The rows that run a fresh process of checkout `tree`: the bare connect and the invoke tasks."""
    env = tree_env(env, tree)
    measurements: list[tuple[Row, Callable[[], object]]] = [
        (Row("bare connect+true (process)", login.label, label, round_trips=1),
         lambda: run_checked([PYTHON, "-c", BARE_PROCESS, str(tree), host], env, cwd=tree)),
    ]

    def task(row: Row, args: list[str], extra: Callable[[], dict[str, str]] = dict) -> None:
        proc = subprocess.run([str(INVOKE), *args, "--host", host, "--json"], capture_output=True, text=True,
                              env={**env, **extra()}, cwd=tree, timeout=120)
        if proc.returncode not in (0, 1):  # 1: a check failed (no GPU, no torch on this host): still timed
            raise RuntimeError(f"{row.name} exited {proc.returncode}: {proc.stderr.strip()[-600:]}")
        row.round_trips = max(row.round_trips or 0, json.loads(proc.stdout)["round_trips"])

    def cold_master() -> dict[str, str]:
        # A control folder of its own each time: the task opens a master (it lingers 2 s, then ends)
        return {"SPECOPS_SSH_CONTROL_DIR": tempfile.mkdtemp(dir=env["SPECOPS_SSH_CONTROL_DIR"]),
                "SPECOPS_SSH_PERSIST": "2"}

    def no_sharing() -> dict[str, str]:
        return {"SPECOPS_SSH_PERSIST": "0"}

    for name, args, extra in (("invoke check", ["check"], dict),
                              ("invoke status (master up)", ["status"], dict),
                              ("invoke status (opens a master)", ["status"], cold_master),
                              ("invoke status (no sharing: fabric)", ["status"], no_sharing),
                              ("invoke patch status (master up)", ["patch", "status"], dict)):
        row = Row(name, login.label, label)
        measurements.append((row, functools.partial(task, row, args, extra)))
    return measurements


def login_measurements(login: Login, host: str, server: SshServer, known_hosts: Path,
                       env: dict[str, str]) -> list[tuple[Row, Callable[[], object]]]:
    """What to time for one login, as (row, function) pairs; `round_trips` is filled in as they run."""
    target = load_inventory(Path(env["SPECOPS_INVENTORY"])).host(host)
    measurements: list[tuple[Row, Callable[[], object]]] = [
        (Row("ssh true (OpenSSH)", login.label),
         lambda: run_checked(ssh_argv(server, known_hosts, login.user, "true"))),
    ]

    def bare(nagle_on: bool) -> None:
        with nagle(nagle_on), open_connection(target) as conn:
            assert nodelay_in_effect(conn) is not nagle_on
            assert conn.run(["true"]).exit_code == 0

    def agent(nagle_on: bool) -> None:
        with nagle(nagle_on), open_connection(target) as conn:
            assert agent_call(conn, target, ["job", "list"]).ok

    for nagle_on in (False, True):
        suffix = "Nagle on" if nagle_on else "NODELAY"
        measurements += [
            (Row(f"bare connect+true (in-proc, {suffix})", login.label, round_trips=1),
             functools.partial(bare, nagle_on)),
            (Row(f"agent job list (in-proc, {suffix})", login.label, round_trips=1),
             functools.partial(agent, nagle_on)),
        ]

    return measurements


def run_interleaved(measurements: list[tuple[Row, Callable[[], object]]], n: int) -> list[Row]:
    """One warm-up each, then N rounds of every measurement in turn, so load from elsewhere hits all alike."""
    for _row, function in measurements:
        function()  # first connection, agent bundle install, page cache
    for _ in range(n):
        for row, function in measurements:
            started = time.perf_counter()
            function()
            row.times.append(time.perf_counter() - started)
    return [row for row, _function in measurements]


def print_table(rows: list[Row]) -> None:
    floors = {row.login: row.median_ms for row in rows if row.name.startswith("ssh true")}
    print(f"{'measurement':42} {'login':14} {'tree':7} {'median ms':>10} {'p90 ms':>8} {'trips':>6} "
          f"{'x ssh true':>10}")
    for row in rows:
        trips = "-" if row.round_trips is None else str(row.round_trips)
        ratio = row.median_ms / floors[row.login] if row.login in floors else float("nan")
        print(f"{row.name:42} {row.login:14} {row.tree:7} {row.median_ms:10.1f} {row.p90_ms:8.1f} {trips:>6} "
              f"{ratio:10.2f}")
    before = {(row.name, row.login): row for row in rows if row.tree == "before"}
    if before:
        print(f"\n{'this tree / before, median':42} {'login':14} {'this ms':>8} {'before ms':>10} {'ratio':>6}")
        for row in rows:
            old = before.get((row.name, row.login))
            if row.tree == "this" and old is not None:
                print(f"{row.name:42} {row.login:14} {row.median_ms:8.1f} {old.median_ms:10.1f} "
                      f"{row.median_ms / old.median_ms:6.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=5, help="timed runs per measurement (after one warm-up)")
    parser.add_argument("--before", type=Path, help="another checkout to time the process rows of, side by side")
    parser.add_argument("--no-bytecode", action="store_true", help="PYTHONDONTWRITEBYTECODE=1 for every command")
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="specops-bench-latency-"))
    root.chmod(0o755)  # the clean user's home lives below it
    server = start_sshd(root / "sshd", clean_login=False)
    clean: Login | None = None
    inventory: Path | None = None
    started = time.perf_counter()
    try:
        known_hosts = root / "known_hosts"
        known_hosts.write_text(server.known_hosts_line())
        clean = make_clean_user(root)
        (server.root / "authorized_keys").chmod(0o644)  # read as the user it authorises; a public key
        logins = [Login("root+pyenv rc", pwd.getpwuid(os.getuid()).pw_name, root / "root-workdir")]
        if clean is not None:
            logins.append(clean)
        hosts: dict[str, dict] = {"local": {"connection": "local", "workdir": str(root / "local"), "python": PYTHON}}
        for index, login in enumerate(logins):
            for suffix in ("", "-before") if options.before else ("",):
                hosts[f"h{index}{suffix}"] = {
                    "address": "127.0.0.1", "port": server.port, "user": login.user,
                    "identity_file": str(server.client_key), "known_hosts": str(known_hosts),
                    "workdir": str(login.workdir) + suffix, "python": HOST_PYTHON, "connect_timeout": 10}
            if options.before:
                (login.workdir.parent / f"{login.workdir.name}-before").mkdir(exist_ok=True)
                shutil.chown(login.workdir.parent / f"{login.workdir.name}-before", login.user)
        inventory = write_inventory(root / "inventory.yaml", hosts, default="local")
        env = {key: value for key, value in os.environ.items()
               if not key.startswith("SPECOPS_") and key != "PYTHONDONTWRITEBYTECODE"}
        control = root / "mux"
        control.mkdir(mode=0o700)
        env.update(SPECOPS_INVENTORY=str(inventory), SPECOPS_LOGS=str(root / "logs"), NO_COLOR="1",
                   SPECOPS_SSH_CONTROL_DIR=str(control))
        if options.no_bytecode:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        os.environ.update(SPECOPS_INVENTORY=str(inventory), SPECOPS_LOGS=str(root / "logs"))
        trees = [("this", REPO)] + ([("before", options.before.resolve())] if options.before else [])
        measurements: list[tuple[Row, Callable[[], object]]] = []
        for label, tree in trees:
            measurements += [
                (Row("invoke --version (no SSH)", "-", label),
                 functools.partial(run_checked, [str(INVOKE), "--version"], tree_env(env, tree), tree)),
                (Row("invoke --list (no SSH)", "-", label),
                 functools.partial(run_checked, [str(INVOKE), "--list"], tree_env(env, tree), tree)),
                (Row("invoke hosts (no SSH)", "-", label),
                 functools.partial(run_checked, [str(INVOKE), "hosts", "--json"], tree_env(env, tree), tree))]
        for index, login in enumerate(logins):
            measurements += login_measurements(login, f"h{index}", server, known_hosts, env)
            for label, tree in trees:
                host = f"h{index}" if label == "this" else f"h{index}-before"
                measurements += process_measurements(login, host, env, tree, label)
        load_before = os.getloadavg()[0]
        rows = run_interleaved(measurements, options.n)
        print(f"specops latency, {options.n} runs each after one warm-up, sshd on 127.0.0.1, "
              f"{os.cpu_count()} CPUs, load {load_before:.1f} before / {os.getloadavg()[0]:.1f} after, "
              f"bytecode caches {'off' if options.no_bytecode else 'on'}")
        print_table(rows)
        print(f"(whole bench: {time.perf_counter() - started:.0f} s)")
        return 0
    finally:
        for socket_path in (root / "mux").rglob("*"):  # end the shared masters before their server
            if socket_path.is_socket():
                subprocess.run(["ssh", "-o", f"ControlPath={socket_path}", "-O", "exit", "unused"],
                               capture_output=True, timeout=10)
        server.stop()
        remove_user(clean)
        if inventory is not None:  # this checkout's record of which host workdirs hold the current agent
            for host in load_inventory(inventory).hosts.values():
                forget_current(host)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
