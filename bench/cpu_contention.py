"""The demo's CPU steps with two competing CPU hogs: the inherited thread settings against specops' own.

    .venv/bin/python bench/cpu_contention.py [--n 2] [--samples N] [--epochs 1] [--no-hogs] [--one-thread]

Sets up a throwaway host workdir with the embedded tiny run (runs/tiny.yaml) and speculators 0.9.0
unpacked into a throwaway site and patched with the CPU patch set (as tests/training does), prepares,
extracts and builds the vocab once, then starts two CPU hogs (busy loops, one per core of a 2-core box)
and times, N rounds of all contenders in turn (the order rotating each round), wall time of:

  extract   `python -m specops step extract --run tiny` (hf backend), from no hidden states
  train     `python -m specops step train --run tiny --fresh --epochs E` (speculators on the CPU)

under these thread settings:

  inherited          the environment a login gives the agent: no OpenMP variables (torch: one thread per
                     CPU, GNU OpenMP spinning at barriers)
  specops            what `job launch` now adds for a CPU job (specops.jobs.threads): pools as large as the
                     cores the process gets (affinity, cgroup quota), OMP_WAIT_POLICY=PASSIVE, KMP_BLOCKTIME=0
  specops, 1 thread  (--one-thread) the same with one thread per pool (what the tests use), for comparison

Each round times every contender quiet (no hogs) and under the hogs, so the slowdown each one suffers
is measured side by side with the fair share: with H hogs beside a job that uses C cores' threads, a
fair scheduler gives the job C/(C+H) of the machine, a slowdown of (C+H)/C (2.0 on 2 cores, 2 hogs).
Median seconds, the ratio to `inherited`, and each contender's hogs/quiet slowdown against the fair
share, with the load average before and after. Prints figures, asserts nothing. Takes ~15-25 min on
a 2-core machine with the defaults; `--no-hogs` times only the quiet side.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from specops.jobs.threads import POOL_VARIABLES, WAIT_VARIABLES, thread_environment, usable_cores  # noqa: E402
from testing.agent import agent_argv, one_document  # noqa: E402
from testing.wheels import site_with  # noqa: E402

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
HOG = "while True: pass"
HOG_COUNT = 2  # one per core of the 2-core machines this was written for


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:
        hog.send_signal(signal.SIGKILL)
        hog.wait()


def base_env(workdir: Path, site: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in POOL_VARIABLES and key not in WAIT_VARIABLES and not key.startswith(("SPECOPS_", "TMUX"))}
    env.update(OFFLINE, SPECOPS_WORKDIR=str(workdir), PYTHONPATH=os.pathsep.join([str(site), str(REPO / "src")]))
    return env


def agent(workdir: Path, env: dict[str, str], *args: str) -> tuple[float, dict]:
    begun = time.perf_counter()
    done = subprocess.run(agent_argv(*args), cwd=workdir, env=env, capture_output=True, text=True, timeout=3600)
    elapsed = time.perf_counter() - begun
    if done.returncode != 0:
        raise RuntimeError(f"{args[:3]} exited {done.returncode}: {done.stderr.strip()[-1500:]}")
    return elapsed, one_document(done.stdout, done.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2, help="rounds of all contenders")
    parser.add_argument("--samples", type=int, default=None,
                        help="rows prepared and extracted (default: the run's; training reads every prepared row)")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per timed training")
    parser.add_argument("--no-hogs", action="store_true", help="time only the quiet side (no CPU hogs)")
    parser.add_argument("--one-thread", action="store_true", help="add the `specops, 1 thread` contender")
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="specops-bench-cpu-"))
    hogs: list[subprocess.Popen] = []
    try:
        site, workdir = root / "site", root / "workdir"
        (workdir / "runs").mkdir(parents=True)
        shutil.copy(REPO / "runs" / "tiny.yaml", workdir / "runs" / "tiny.yaml")
        site_with(site, ("speculators", "0.9.0"))
        plain = base_env(workdir, site)
        cores = int(usable_cores()["cores"])  # type: ignore[call-overload]
        contenders = {
            "inherited": plain,
            "specops": {**plain, **thread_environment(cores)},
        }
        if options.one_thread:
            contenders["specops, 1 thread"] = {**plain, **thread_environment(1)}
        agent(workdir, plain, "patch", "apply", "--set", "speculators-0.9.0-cpu",
              "--patches-dir", str(REPO / "patches"))
        samples = ["--samples", str(options.samples)] if options.samples else []
        for step in (["prepare", *samples], ["extract", *samples], ["vocab"]):
            agent(workdir, plain, "step", *step[:1], "--run", "tiny", *step[1:])
        hidden = workdir / "runs" / "tiny" / "hidden_states"
        load_before = os.getloadavg()
        conditions = ["quiet"] if options.no_hogs else ["quiet", "hogs"]
        times: dict[tuple[str, str, str], list[float]] = {}
        order = list(contenders)
        for round_index in range(options.n):
            for condition in conditions:
                if condition == "hogs":
                    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(HOG_COUNT)]
                for name in order[round_index % len(order):] + order[:round_index % len(order)]:
                    env = contenders[name]
                    shutil.rmtree(hidden, ignore_errors=True)
                    elapsed, document = agent(workdir, env, "step", "extract", "--run", "tiny", *samples)
                    assert document["status"] == "done" and document["counts"]["written"] > 0, document
                    times.setdefault(("extract", name, condition), []).append(elapsed)
                    elapsed, document = agent(workdir, env, "step", "train", "--run", "tiny", "--fresh", "--epochs",
                                              str(options.epochs))
                    assert document["status"] == "done", document
                    times.setdefault(("train", name, condition), []).append(elapsed)
                    print(f"  round {round_index + 1} {condition:5} {name:18} "
                          f"extract {times['extract', name, condition][-1]:6.1f} s  "
                          f"train {times['train', name, condition][-1]:6.1f} s  load {os.getloadavg()[0]:.1f}",
                          flush=True)
                stop_hogs(hogs)
                hogs = []
        load_after = os.getloadavg()
        fair = (cores + HOG_COUNT) / cores
        print(f"specops CPU steps, {options.n} rounds of {' and '.join(conditions)}, {os.cpu_count()} CPUs "
              f"({cores} usable), load {load_before[0]:.1f} before / {load_after[0]:.1f} after (1-min average); "
              f"fair share with {HOG_COUNT} hogs: {fair:.2f}x slower")
        print(f"{'step':8} {'threads':18} {'cond.':6} {'median s':>9} {'runs':>24} {'x inherited':>12} "
              f"{'x quiet':>8} {'x fair':>7}")
        for step in ("extract", "train"):
            for condition in conditions:
                floor = statistics.median(times[step, "inherited", condition])
                for name in contenders:
                    runs = times[step, name, condition]
                    median = statistics.median(runs)
                    listed = ", ".join(f"{value:.1f}" for value in runs)
                    slowdown = median / statistics.median(times[step, name, "quiet"])
                    against_fair = f"{slowdown:8.2f} {slowdown / fair:7.2f}" if condition == "hogs" else ""
                    print(f"{step:8} {name:18} {condition:6} {median:9.1f} {listed:>24} {median / floor:12.2f} "
                          f"{against_fair}")
        return 0
    finally:
        stop_hogs(hogs)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
