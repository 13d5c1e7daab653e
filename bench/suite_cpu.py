"""Where the test suite's CPU goes: every Python process it starts, counted, with the machine's idle share.

    .venv/bin/python bench/suite_cpu.py [--out DIR] [--top 30] -- [pytest args, e.g. tests/e2e -n 2]

The suite is CPU-bound on a 2-core machine (the idle share says whether it is), so its wall time is
its CPU time over the cores: this finds the CPU. For the run, a start-up hook (a .pth file and its
module, removed afterwards) goes into the site-packages of .venv and .venv-vllm; every Python
process started from them — the agents over SSH and the jobs under tmux included, whatever their
environment — appends one line at exit to DIR/processes.jsonl: its argv, its own CPU seconds, its
wall time and the heavy modules it imported (torch, transformers, speculators, vllm, ...). Processes
killed by a signal (a vLLM engine stopped with its group) write nothing, so the table is a floor;
the idle share comes from /proc/stat sampled every second. Prints CPU seconds by kind of process
and by the heaviest module imported. Asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOOK = "zz_specops_suite_cpu"
HEAVY = ("speculators", "vllm", "transformers", "torch", "datasets", "fabric", "paramiko", "invoke", "pydantic")

HOOK_MODULE = '''
import atexit, json, os, resource, sys, time
_STARTED = time.time()
def _record():
    try:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        line = json.dumps({{"argv": sys.argv[:6], "cpu": round(usage.ru_utime + usage.ru_stime, 3),
                           "wall": round(time.time() - _STARTED, 3), "start": round(_STARTED, 1),
                           "cwd": os.getcwd(), "test": os.environ.get("PYTEST_CURRENT_TEST"),
                           "modules": [m for m in {heavy!r} if m in sys.modules]}}) + "\\n"
        fd = os.open({log!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        os.write(fd, line.encode())
        os.close(fd)
    except Exception:
        pass
atexit.register(_record)
'''


def site_packages(venv: Path) -> Path | None:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    return found[0] if found else None


def install(log: Path) -> list[Path]:
    written = []
    for venv in (REPO / ".venv", REPO / ".venv-vllm"):
        site = site_packages(venv)
        if site is None:
            continue
        (site / f"{HOOK}.py").write_text(HOOK_MODULE.format(heavy=HEAVY, log=str(log)))
        (site / f"{HOOK}.pth").write_text(f"import {HOOK}\n")
        written += [site / f"{HOOK}.py", site / f"{HOOK}.pth"]
    return written


def cpu_times() -> tuple[int, int]:
    fields = [int(value) for value in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]  # total, idle + iowait


def kind(argv: list[str]) -> str:
    text = " ".join(argv)
    if "speculators" in text and "train" in text:
        return "speculators train"
    if "speculators" in text:
        return "speculators " + " ".join(argv[1:2])
    if argv and argv[0].endswith("specops/__main__.py"):
        return "agent " + " ".join(argv[1:3])
    if "vllm" in text:
        return "vllm " + Path(argv[0]).name
    if "pytest" in text or (argv[:1] == ["-c"] and len(argv) == 1):
        return "pytest, its workers, bare python -c"
    if argv and argv[0].endswith("invoke"):
        return "invoke " + " ".join(argv[1:2])
    return "python -c" if argv[:1] == ["-c"] else Path(argv[0]).name if argv else "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="suite-cpu-"))
    out.mkdir(parents=True, exist_ok=True)
    log = out / "processes.jsonl"
    log.unlink(missing_ok=True)
    samples: list[tuple[int, int]] = [cpu_times()]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(1.0):
            samples.append(cpu_times())

    hooks = install(log)
    sampler = threading.Thread(target=sample, daemon=True)
    began = time.monotonic()
    try:
        sampler.start()
        code = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args],
                              cwd=REPO).returncode
    finally:
        done.set()
        for path in hooks:
            path.unlink(missing_ok=True)
    wall = time.monotonic() - began
    samples.append(cpu_times())
    total, idle = samples[-1][0] - samples[0][0], samples[-1][1] - samples[0][1]
    # the idle share by minute: where the waits are (a core idle while its worker waits)
    with (out / "idle_by_minute.tsv").open("w") as timeline:
        for minute in range(0, len(samples) - 1, 60):
            first, last = samples[minute], samples[min(minute + 60, len(samples) - 1)]
            share = (last[1] - first[1]) / max(last[0] - first[0], 1)
            timeline.write(f"{minute // 60}\t{100 * share:.0f}\n")
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    by_kind: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    by_module: collections.Counter = collections.Counter()
    for row in rows:
        name = kind(row["argv"])
        by_kind[name] += row["cpu"]
        count[name] += 1
        by_module[next((m for m in HEAVY if m in row["modules"]), "none of them")] += row["cpu"]
    print(f"\npytest exit {code}; wall {wall:.0f} s; machine idle {100 * idle / max(total, 1):.1f}% "
          f"of its CPU time; {len(rows)} Python processes recorded, {sum(by_kind.values()):.0f} CPU s")
    print(f"{'CPU s':>8} {'count':>6} {'each':>6}  kind")
    for name, seconds in by_kind.most_common(args.top):
        print(f"{seconds:8.1f} {count[name]:6d} {seconds / count[name]:6.2f}  {name}")
    print("by the heaviest module a process imported: " + ", ".join(
        f"{name} {seconds:.0f} s" for name, seconds in by_module.most_common()))
    print(f"(lines in {log}; the idle share by minute in {out / 'idle_by_minute.tsv'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
