"""Wall time of `python -m specops patch verify --set speculators-0.3.0` on a throwaway host.

The host is built as tests/patching/conftest.py builds it: speculators 0.3.0 and vLLM 0.16.0 unpacked
from the real wheels into their own site folders, put first on PYTHONPATH, with this interpreter's
own site-packages (torch, transformers) after them. The agent is copied into the host's workdir, as
the control side syncs it, so the first call compiles its bytecode (cold) and later calls reuse it
(warm). Prints the best of several runs, the ratio to `python -c pass` with the same interpreter, and how many files
the static analysis parsed.

    .venv/bin/python bench/patch_verify.py [--runs 7] [--keep DIR] [--agent OTHER/src/specops]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.wheels import site_with  # noqa: E402  (needs the repo root on the path)

SET_NAME = "speculators-0.3.0"


def build_host(root: Path, agent_source: Path) -> dict[str, str]:
    """Sites, workdir and agent copy under `root`; returns the environment the host's python runs in."""
    speculators, vllm, work = root / "speculators", root / "vllm", root / "work"
    site_with(speculators, ("speculators", "0.3.0"))
    site_with(vllm, ("vllm", "0.16.0"))
    shutil.copytree(REPO / "patches" / SET_NAME, work / "patches" / SET_NAME)
    shutil.copytree(agent_source, work / "agent" / "specops",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env.update(SPECOPS_WORKDIR=str(work), PYTHONPATH=os.pathsep.join([str(speculators), str(vllm),
                                                                      str(work / "agent")]))
    return env


@dataclass(frozen=True)
class Run:
    wall: float
    cpu: float  # user + system of the child: steadier than wall time on a shared machine
    code: int
    document: dict


def timed(command: list[str], env: dict[str, str], cwd: Path) -> Run:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Run(wall, cpu, result.returncode, json.loads(result.stdout) if result.stdout.strip() else {})


def agent(env: dict[str, str], *args: str) -> Run:
    return timed([sys.executable, "-m", "specops", "patch", *args], env, Path(env["SPECOPS_WORKDIR"]))


def best(runs: list[Run]) -> tuple[float, float]:
    # the fastest run is the one least disturbed by other work on a shared machine (as timeit does)
    return min(r.wall for r in runs), min(r.cpu for r in runs)


def errors(document: dict) -> list[str]:
    return sorted(f"{Path(f['file']).name}:{f['line']}" for check in document["checks"]
                  for f in check["findings"] if f["status"] == "error")


def files_parsed(document: dict) -> str:
    return str(document.get("analysis", {}).get("files_parsed", "n/a"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="warm runs per measurement (the best is printed)")
    parser.add_argument("--keep", type=Path, help="build the host here and keep it (default: a temp folder)")
    parser.add_argument("--agent", type=Path, default=REPO / "src" / "specops",
                        help="the specops package to run on the host (to compare two versions)")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-patch-verify-"))
    try:
        env = build_host(root, args.agent)
        work = Path(env["SPECOPS_WORKDIR"])
        blank = best([timed([sys.executable, "-c", "pass"], env, work) for _ in range(args.runs)])

        cold = agent(env, "verify", "--set", SET_NAME)
        found = errors(cold.document)
        if cold.code != 1 or found != ["vllm_hidden_states_generator.py:136", "vllm_hidden_states_generator.py:148",
                                       "vllm_hidden_states_generator.py:194"]:
            raise SystemExit(f"pristine verify: exit {cold.code}, errors {found}; expected the 3 real breaks")
        pristine = [agent(env, "verify", "--set", SET_NAME) for _ in range(args.runs)]

        applied = agent(env, "apply", "--set", SET_NAME)
        if applied.code != 0:
            raise SystemExit(f"apply failed: {applied.document['sets'][0]['detail']}")
        patched = [agent(env, "verify", "--set", SET_NAME) for _ in range(args.runs)]
        if {r.code for r in patched} != {0} or errors(patched[0].document):
            raise SystemExit(f"verify after apply: errors {errors(patched[0].document)}")

        print(f"python: {sys.executable} ({sys.version.split()[0]}), agent {args.agent}, "
              f"best of {args.runs} warm runs")
        print(f"{'measurement':<36}{'wall s':>8}{'x pass':>8}{'cpu s':>8}{'x pass':>8}{'files parsed':>14}")
        rows = [("python -c pass", blank, "-"),
                ("verify, pristine tree, cold agent", (cold.wall, cold.cpu), files_parsed(cold.document)),
                ("verify, pristine tree, warm", best(pristine), files_parsed(pristine[0].document)),
                ("verify, after apply, warm", best(patched), files_parsed(patched[0].document))]
        for name, (wall, cpu), parsed in rows:
            print(f"{name:<36}{wall:>8.3f}{wall / blank[0]:>8.1f}{cpu:>8.3f}{cpu / blank[1]:>8.1f}{parsed:>14}")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
