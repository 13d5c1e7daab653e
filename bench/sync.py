"""`invoke sync` against plain rsync of the same tree, with the same filters, over the same sshd.

    .venv/bin/python bench/sync.py [--n 5] [--before PATH]

Starts a throwaway sshd on 127.0.0.1 (testing/sshd.py), and pushes this checkout's src/,
patches/ and runs/*.yaml into three workdirs on that host, one per contender:

  rsync -a           plain rsync, quick check (size + mtime), remote.sync.RSYNC_FILTERS, ssh -e
  rsync -a (master)  the same over a shared OpenSSH master (ControlMaster/ControlPersist), as ours uses
  rsync -rlptc       remote.sync's own rsync flags (whole-file checksums on both sides), no invoke
  invoke sync        the task: `invoke sync --host H --json` (staging the tree, then one rsync over
                     the shared master its warm-up opened: remote.ssh.openssh)
  invoke sync (no master)  the same with SPECOPS_SSH_PERSIST=0: a fresh SSH login every time
  invoke sync (before)  with --before PATH: the same task from another checkout (e.g. `git worktree add
                     ../before <commit>`), into a workdir of its own, interleaved with the others

in two cases, after one warm-up each and N rounds of all contenders in turn (median and p90 in ms):
  no change          nothing differs: the cost of finding that out
  one file changed   one file on the host was edited (outside the timing), so exactly one file moves

The checkout itself is never written to; the "change" is made on the host side. Ratios are against
plain `rsync -a`. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from remote.agent import forget_current  # noqa: E402
from remote.inventory import load_inventory  # noqa: E402
from remote.sync import RSYNC_FILTERS  # noqa: E402
from testing.cli import INVOKE, write_inventory  # noqa: E402
from testing.sshd import SshServer, start_sshd  # noqa: E402

PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").exists() else sys.executable
EDITED = "src/specops/cli.py"  # the file edited on the host in the one-file case


@dataclass
class Row:
    name: str
    case: str
    times: list[float] = field(default_factory=list)
    moved: set[int] = field(default_factory=set)  # files reported as sent, per run

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times) * 1000

    @property
    def p90_ms(self) -> float:
        return statistics.quantiles(self.times, n=10, method="inclusive")[8] * 1000 if len(self.times) > 1 \
            else self.times[0] * 1000


def ssh_command(server: SshServer, known_hosts: Path) -> str:
    return shlex.join(["ssh", "-F", "/dev/null", "-p", str(server.port), "-i", str(server.client_key),
                       "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                       "-o", f"UserKnownHostsFile={known_hosts}"])


def plain_rsync(flags: list[str], server: SshServer, known_hosts: Path, user: str, workdir: Path,
                master: Path | None = None) -> Callable[[], int]:
    shell = ssh_command(server, known_hosts)
    if master is not None:
        shell += f" -o ControlMaster=auto -o ControlPath={master} -o ControlPersist=120"

    def run() -> int:
        argv = ["rsync", *flags, "--delete", "--itemize-changes", *RSYNC_FILTERS,
                "-e", shell, f"{REPO}/", f"{user}@127.0.0.1:{workdir}/"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"rsync exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
        return sum(1 for line in proc.stdout.splitlines() if line[:2] in ("<f", ">f"))
    return run


def invoke_sync(env: dict[str, str], tree: Path = REPO, host: str = "h", **extra: str) -> Callable[[], int]:
    env = {**env, "PYTHONPATH": f"{tree / 'src'}:{tree}", **extra}

    def run() -> int:
        proc = subprocess.run([str(INVOKE), "sync", "--host", host, "--json"], capture_output=True, text=True,
                              env=env, cwd=tree, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"invoke sync exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
        return len(json.loads(proc.stdout)["changed"])
    return run


def edit_on_host(workdir: Path) -> None:
    target = workdir / EDITED
    target.write_bytes(target.read_bytes() + b"# edited on the host\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=5, help="rounds per case (after one warm-up)")
    parser.add_argument("--before", type=Path, help="another checkout whose `invoke sync` is timed alongside")
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="specops-bench-sync-"))
    server = start_sshd(root / "sshd", clean_login=False)
    inventory: Path | None = None
    started = time.perf_counter()
    try:
        known_hosts = root / "known_hosts"
        known_hosts.write_text(server.known_hosts_line())
        user = server.user
        workdirs = {name: root / name for name in ("plain", "master", "ours", "invoke", "fresh", "before")}
        hosts = {name: {"address": "127.0.0.1", "port": server.port, "user": user,
                        "identity_file": str(server.client_key), "known_hosts": str(known_hosts),
                        "workdir": str(workdirs[folder]), "python": PYTHON}
                 for name, folder in (("h", "invoke"), ("hf", "fresh"), ("hb", "before"))}
        (root / "ssh").mkdir(mode=0o700)
        inventory = write_inventory(root / "inventory.yaml", hosts, default="h")
        # Bytecode caches written and reused, as for a user (some sandboxes set PYTHONDONTWRITEBYTECODE).
        env = {key: value for key, value in os.environ.items()
               if not key.startswith("SPECOPS_") and key != "PYTHONDONTWRITEBYTECODE"}
        env.update(SPECOPS_INVENTORY=str(inventory), SPECOPS_LOGS=str(root / "logs"), NO_COLOR="1",
                   SPECOPS_SSH_CONTROL_DIR=str(root / "ssh"))
        contenders = {
            "rsync -a": (plain_rsync(["-a"], server, known_hosts, user, workdirs["plain"]), workdirs["plain"]),
            "rsync -a (master)": (plain_rsync(["-a"], server, known_hosts, user, workdirs["master"],
                                              root / "ssh" / "plain-master"), workdirs["master"]),
            "rsync -rlptc (ours)": (plain_rsync(["-rlptc"], server, known_hosts, user, workdirs["ours"]),
                                    workdirs["ours"]),
            "invoke sync": (invoke_sync(env), workdirs["invoke"]),
            "invoke sync (no master)": (invoke_sync(env, host="hf", SPECOPS_SSH_PERSIST="0"), workdirs["fresh"]),
        }
        if options.before:
            contenders["invoke sync (before)"] = (invoke_sync(env, options.before.resolve(), "hb"),
                                                  workdirs["before"])
        files = len(list((REPO / "src").rglob("*.py")))
        rows: list[Row] = []
        load_before = os.getloadavg()[0]
        for case in ("no change", "one file changed"):
            case_rows = {name: Row(name, case) for name in contenders}
            for run, workdir in contenders.values():  # warm-up: the first full push
                if case != "no change":
                    edit_on_host(workdir)
                run()
            for _ in range(options.n):
                for name, (run, workdir) in contenders.items():
                    if case != "no change":
                        edit_on_host(workdir)
                    begun = time.perf_counter()
                    moved = run()
                    case_rows[name].times.append(time.perf_counter() - begun)
                    case_rows[name].moved.add(moved)
            rows += case_rows.values()
        print(f"specops sync, {options.n} rounds per case after one warm-up, sshd on 127.0.0.1 as {user}, "
              f"tree of ~{files} .py files, {os.cpu_count()} CPUs, "
              f"load {load_before:.1f} before / {os.getloadavg()[0]:.1f} after")
        print(f"{'contender':24} {'case':18} {'median ms':>10} {'p90 ms':>8} {'files sent':>11} {'x rsync -a':>10}")
        floors = {row.case: row.median_ms for row in rows if row.name == "rsync -a"}
        for row in rows:
            moved = ",".join(str(count) for count in sorted(row.moved))
            print(f"{row.name:24} {row.case:18} {row.median_ms:10.1f} {row.p90_ms:8.1f} {moved:>11} "
                  f"{row.median_ms / floors[row.case]:10.2f}")
        print(f"(whole bench: {time.perf_counter() - started:.0f} s)")
        return 0
    finally:
        server.stop()
        if inventory is not None:
            for name in ("h", "hf", "hb"):
                forget_current(load_inventory(inventory).host(name))
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
