"""Loads saved between runs and by overlap (issue 34, items 2 and 4), side by side.

    python bench/reuse.py [--samples 24] [--before REV|PATH] [--no-overlap] [--no-between]

Between runs: workdir A's run extracts (its server starts and is left up, as a kept server is); workdir B,
the same target, extracts through A's server; workdir C, the same target on a port of its own, extracts
through a dedicated server. For each: server starts in its own job records, the step's seconds, and the
files against A's (sha256).

Overlap: the tiny run with `backend: vllm`, regenerate and evaluate off (the extraction server is launched
ahead of prepare), through the whole `pipeline` with the agent of REV (the vocab step after extract) and
with this tree (vocab while the server loads): each step's seconds and the pipeline's. Needs .venv-vllm.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loads import REPO, agent, digests, patch_serve_env

from testing.vllm import free_port, tiny_workdir

SERVER = "vllm-server"


def starts(folder: Path) -> int:
    jobs = folder / "state" / "jobs"
    return sum(1 for path in jobs.glob("*.json") if not path.name.endswith(".environ.json")
               and json.loads(path.read_text()).get("name") == SERVER) if jobs.is_dir() else 0


def files(folder: Path) -> dict[str, str]:
    return digests(folder / "runs" / "tiny" / "hidden_states")


def extract(folder: Path, samples: int, *extra: str) -> dict:
    started = time.perf_counter()
    code, report, stderr = agent(folder, REPO / "src", "step", "extract", "--run", "tiny", "--samples", str(samples),
                                 *extra)
    if code != 0:
        raise SystemExit(f"extract in {folder} exited {code}: {json.dumps(report)[:1500]}\n{stderr[-3000:]}")
    return {"seconds": round(time.perf_counter() - started, 1), "starts": starts(folder),
            "reused": (report.get("server") or {}).get("reused"), "owner": (report.get("server") or {}).get("owner")}


def between_runs(root: Path, samples: int) -> None:
    port = free_port()
    owner, borrower = tiny_workdir(root / "a", port), tiny_workdir(root / "b", port)
    dedicated = tiny_workdir(root / "c", free_port())
    from testing.runs import edit_run

    edit_run(owner / "runs" / "tiny.yaml", vllm={"keep_server": True})  # A's server outlives its step (issue 54)
    rows = {"A (starts the server)": extract(owner, samples)}
    rows["B (A's server)"] = extract(borrower, samples)
    rows["C (a server of its own)"] = extract(dedicated, samples, "--stop-server")
    agent(owner, REPO / "src", "job", "stop", SERVER, "--run", "tiny")
    reference = files(owner)
    print(f"\nbetween runs: `step extract --samples {samples}` of the same tiny target in three workdirs")
    print(f"{'':26} {'server starts':>13} {'step s':>7}  {'files equal to A':>16}  reused")
    for name, row, folder in zip(rows, rows.values(), (owner, borrower, dedicated), strict=True):
        mine = files(folder)
        equal = sum(1 for key, digest in mine.items() if reference.get(key) == digest)
        print(f"{name:26} {row['starts']:>13} {row['seconds']:>7}  {f'{equal} of {len(mine)}':>16}  "
              f"{row['reused']}", flush=True)


def overlap_workdir(root: Path, samples: int) -> Path:
    import yaml

    folder = tiny_workdir(root, free_port())
    os.symlink(REPO / "patches", folder / "patches")
    config = yaml.safe_load((REPO / "runs" / "tiny.yaml").read_text())
    config.update(backend="vllm", samples=samples)
    config["vllm"]["port"] = free_port()
    config["train"]["epochs"] = 1
    config["regenerate"]["enabled"] = False
    config["evaluate"].update(enabled=False, heldout_prompts=0)
    (folder / "runs" / "tiny.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


def overlap(root: Path, samples: int, before: str) -> None:
    old = Path(before)
    if not (old / "src" / "specops").is_dir():
        old = root / "before-src"
        old.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", before, "src"], cwd=REPO, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
    rows = {}
    for name, src in ((f"before ({before})", old / "src"), ("after (this tree)", REPO / "src")):
        folder = overlap_workdir(root / name.split()[0], samples)
        started = time.perf_counter()
        code, summary, stderr = agent(folder, src, "pipeline", "--run", "tiny")
        if code != 0:
            raise SystemExit(f"pipeline with {src} exited {code}: {json.dumps(summary)[:1500]}\n{stderr[-3000:]}")
        steps = summary["steps"]
        rows[name] = {**{step: (steps.get(step) or {}).get("seconds") for step in ("prepare", "vocab", "extract")},
                      "order": " ".join(step for step in steps if step in ("prepare", "vocab", "extract")),
                      "pipeline_s": round(time.perf_counter() - started, 1)}
    print(f"\noverlap: the tiny run, backend vllm, no regenerate (the server launched ahead of prepare), {samples} "
          "samples, 1 epoch")
    print(f"{'':22} {'prepare s':>9} {'vocab s':>8} {'extract s':>9} {'sum':>6} {'pipeline s':>10}  order")
    for name, row in rows.items():
        total = round(sum(row[step] or 0.0 for step in ("prepare", "vocab", "extract")), 1)
        print(f"{name:22} {row['prepare']!s:>9} {row['vocab']!s:>8} {row['extract']!s:>9} {total:>6} "
              f"{row['pipeline_s']:>10}  {row['order']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--before", default="HEAD~1", help="the agent before the overlap: a git revision or a "
                        "folder holding its src/ (default %(default)s)")
    parser.add_argument("--no-overlap", action="store_true", help="only the runs sharing a server")
    parser.add_argument("--no-between", action="store_true", help="only the overlap")
    args = parser.parse_args()
    patch_serve_env()
    with tempfile.TemporaryDirectory(prefix="bench-reuse-") as tmp:
        if not args.no_between:
            between_runs(Path(tmp) / "between", args.samples)
        if not args.no_overlap:
            overlap(Path(tmp) / "overlap", args.samples, args.before)


if __name__ == "__main__":
    main()
