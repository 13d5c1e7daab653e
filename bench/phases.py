"""Where the time of a one-round-trip task goes, phase by phase, side by side in one run.

    .venv/bin/python bench/phases.py [--n 7]

Starts a throwaway sshd on 127.0.0.1 (testing/sshd.py) and, for root's login (its ~/.bashrc
runs pyenv) and a throwaway clean login (see bench/latency.py), times N interleaved rounds of:

  control side, fresh processes (no network):
    python -c pass         the interpreter alone
    invoke --version       + Invoke's own imports: the floor of every task
    invoke --list          + tasks.py and every task module
  control side, one fresh process timing its own phases (`PHASES` below; median of each):
    import invoke / tasks / remote.inventory / remote.ssh.connection (fabric, paramiko, cryptography)
    inventory load, bundle digest (hashing the agent's files), TCP connect, key exchange,
    authentication, one command (`true`), one agent call (`job list`)
  host side, through OpenSSH (`ssh H CMD`, the same key):
    ssh H true             the floor the goal is measured against
    ssh H python -c pass   + the host's python starting (site included), `-S` and `-I` beside it
    ssh H agent job list   + the agent's prelude and its imports, as agent_call runs it
The negotiated kex, cipher, MAC and host-key type of paramiko's connection are printed too.
Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from latency import HOST_PYTHON, PYTHON, Login, make_clean_user, remove_user, ssh_argv  # noqa: E402

from remote.agent import agent_argv, forget_current  # noqa: E402
from remote.bundle import build_bundle  # noqa: E402
from remote.inventory import load_inventory  # noqa: E402
from testing.cli import INVOKE, write_inventory  # noqa: E402
from testing.sshd import start_sshd  # noqa: E402

# Runs in a fresh interpreter: argv[1] the repo, argv[2] the host. Prints one JSON object of
# phase -> seconds. paramiko's key exchange and authentication are timed by wrapping the two
# methods fabric's connect goes through (measurement only; nothing in remote/ is changed).
PHASES = r"""
import json, sys, time
clock = time.perf_counter
marks = {}
def timed(name, start):
    marks[name] = marks.get(name, 0.0) + clock() - start
sys.path.insert(0, sys.argv[1])
t = clock(); import invoke; timed("import invoke", t)
t = clock(); import tasks; timed("import tasks (every task module)", t)
t = clock(); import remote.inventory; timed("import remote.inventory", t)
t = clock(); import remote.ssh.connection; timed("import fabric+paramiko+cryptography", t)
import paramiko
from remote.agent import agent_call
from remote.bundle import build_bundle
from remote.ssh import open_connection
t = clock(); host = remote.inventory.load_inventory().host(sys.argv[2]); timed("inventory load", t)
t = clock(); build_bundle().digest; timed("bundle digest", t)
real_start, real_auth = paramiko.Transport.start_client, paramiko.SSHClient._auth
def start_client(self, *args, **kwargs):
    t = clock(); result = real_start(self, *args, **kwargs); timed("key exchange (paramiko)", t)
    return result
def auth(self, *args, **kwargs):
    t = clock(); result = real_auth(self, *args, **kwargs); timed("authentication (paramiko)", t)
    return result
real_parse = paramiko.Transport._parse_kex_init
def parse_kex_init(self, *args, **kwargs):
    result = real_parse(self, *args, **kwargs)
    marks["kex"] = type(self.kex_engine).__name__
    return result
paramiko.Transport.start_client, paramiko.SSHClient._auth = start_client, auth
paramiko.Transport._parse_kex_init = parse_kex_init
t = clock(); conn = open_connection(host); timed("connect (TCP+kex+auth)", t)
transport = conn.transport
t = clock(); assert conn.run(["true"]).exit_code == 0; timed("one command: true", t)
t = clock(); assert agent_call(conn, host, ["job", "list"]).ok; timed("one agent call: job list", t)
conn.close()
marks["negotiated"] = " ".join([marks.pop("kex", "?"), transport.remote_cipher,
                                transport.remote_mac, transport.host_key_type])
print(json.dumps(marks))
"""


def timed_run(argv: list[str], env: dict[str, str]) -> Callable[[], float]:
    def run() -> float:
        started = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[:6]} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
        return time.perf_counter() - started
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=7, help="rounds (after one warm-up)")
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="specops-bench-phases-"))
    root.chmod(0o755)
    server = start_sshd(root / "sshd", clean_login=False)
    clean: Login | None = None
    inventory: Path | None = None
    try:
        known_hosts = root / "known_hosts"
        known_hosts.write_text(server.known_hosts_line())
        (server.root / "authorized_keys").chmod(0o644)
        clean = make_clean_user(root)
        logins = [Login("root+pyenv rc", pwd.getpwuid(os.getuid()).pw_name, root / "root-workdir")]
        logins += [clean] if clean is not None else []
        hosts = {f"h{index}": {"address": "127.0.0.1", "port": server.port, "user": login.user,
                               "identity_file": str(server.client_key), "known_hosts": str(known_hosts),
                               "workdir": str(login.workdir), "python": HOST_PYTHON, "connect_timeout": 10}
                 for index, login in enumerate(logins)}
        inventory = write_inventory(root / "inventory.yaml", hosts, default="h0")
        env = {key: value for key, value in os.environ.items()
               if not key.startswith("SPECOPS_") and key != "PYTHONDONTWRITEBYTECODE"}
        env.update(SPECOPS_INVENTORY=str(inventory), SPECOPS_LOGS=str(root / "logs"), NO_COLOR="1",
                   PYTHONPATH=f"{REPO / 'src'}:{REPO}")
        os.environ.update(SPECOPS_INVENTORY=str(inventory), SPECOPS_LOGS=str(root / "logs"))
        digest = build_bundle().digest
        simple: dict[tuple[str, str], Callable[[], float]] = {
            ("-", "python -c pass"): timed_run([PYTHON, "-c", "pass"], env),
            ("-", "invoke --version"): timed_run([str(INVOKE), "--version"], env),
            ("-", "invoke --list"): timed_run([str(INVOKE), "--list"], env),
        }
        for index, login in enumerate(logins):
            host = load_inventory(inventory).host(f"h{index}")
            ssh = [*ssh_argv(server, known_hosts, login.user)]
            agent = agent_argv(host, ["job", "list"], env_role=None, digest=digest, install=False)
            simple.update({
                (login.label, "ssh H true"): timed_run([*ssh, "true"], env),
                (login.label, "ssh H python -c pass"): timed_run([*ssh, HOST_PYTHON, "-c", "pass"], env),
                (login.label, "ssh H python -S -c pass"): timed_run([*ssh, HOST_PYTHON, "-S", "-c", "pass"], env),
                (login.label, "ssh H python -I -c pass"): timed_run([*ssh, HOST_PYTHON, "-I", "-c", "pass"], env),
                (login.label, "ssh H agent job list"): timed_run([*ssh, shlex.join(agent)], env),
            })
        phases_argv = {login.label: [PYTHON, "-c", PHASES, str(REPO), f"h{index}"]
                       for index, login in enumerate(logins)}
        times: dict[tuple[str, str], list[float]] = {}
        negotiated: dict[str, str] = {}
        load_before = os.getloadavg()[0]
        for round_index in range(options.n + 1):
            for label, argv in phases_argv.items():  # first: round 0 installs the agent
                proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
                if proc.returncode != 0:
                    raise RuntimeError(f"phases exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
                marks = json.loads(proc.stdout)
                negotiated[label] = marks.pop("negotiated")
                if round_index:
                    for name, seconds in marks.items():
                        times.setdefault((label, name), []).append(seconds)
            for key, run in simple.items():
                elapsed = run()
                if round_index:
                    times.setdefault(key, []).append(elapsed)
        print(f"specops phases, {options.n} rounds after one warm-up, sshd on 127.0.0.1, {os.cpu_count()} CPUs, "
              "bytecode caches on, "
              f"load {load_before:.1f} before / {os.getloadavg()[0]:.1f} after")
        for label, text in negotiated.items():
            print(f"paramiko negotiated ({label}): {text}")
        print(f"{'phase':42} {'login':14} {'median ms':>10} {'min ms':>8}")
        for (label, name), values in times.items():
            print(f"{name:42} {label:14} {statistics.median(values) * 1000:10.1f} {min(values) * 1000:8.1f}")
        return 0
    finally:
        server.stop()
        remove_user(clean)
        if inventory is not None:
            for host in load_inventory(inventory).hosts.values():
                forget_current(host)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
