"""vLLM server loads per pipeline, before and after issue 34, side by side; and how honest the speedup's baseline is.

    python bench/loads.py [--before REV|PATH] [--samples 48] [--epochs 2] [--no-before]

The tiny run with `backend: vllm` (regenerate, the parity gate's served check and evaluate on) runs the
whole `pipeline` twice on fresh workdirs: once with the agent of git revision REV (default: the commit
before issue 34's first, d622b20; `git archive` of its src/ into a temporary folder) and once with this
tree. For each: vLLM server starts (the run's `vllm-server` job records), the seconds they took to get
ready (the job log's "vLLM server ready in N s" lines), the pipeline's seconds, the speedup evaluate
reported and whether a server was left running afterwards. Then, on the after workdir: the target-alone
rate the extraction server measured during extract (evaluate's baseline) against a dedicated target-alone
server's on the same prompts and settings, and the hidden-state files against a dedicated extraction
server's (sha256). Needs .venv-vllm (scripts/setup-vllm.sh). Asserts nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

from testing.vllm import PATCH_SET, VLLM_PYTHON, free_port, tiny_workdir  # noqa: E402

RUN = "loads"
BEFORE = "d622b20"
ENV = {"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON), "VLLM_CPU_KVCACHE_SPACE": "1"}
_READY = re.compile(r"vLLM server ready in ([0-9.]+) s \(job (\S+),")


def agent(workdir: Path, src: Path, *args: str, python: Path = REPO / ".venv" / "bin" / "python",
          timeout: float = 3600) -> tuple[int, dict, str]:
    env = {**os.environ, **ENV, "SPECOPS_WORKDIR": str(workdir), "PYTHONPATH": str(src)}
    done = subprocess.run([str(python), "-m", "specops", *args], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=timeout)
    lines = done.stdout.strip().splitlines()
    return done.returncode, (json.loads(lines[-1]) if lines else {}), done.stderr


def workdir(root: Path, samples: int, epochs: int) -> Path:
    import yaml

    folder = tiny_workdir(root, free_port())
    os.symlink(REPO / "patches", folder / "patches")
    config = yaml.safe_load((REPO / "runs" / "tiny.yaml").read_text())
    config.update(backend="vllm", samples=samples)
    config["vllm"]["port"] = free_port()
    config["train"]["epochs"] = epochs
    config["evaluate"].update(heldout_prompts=8, max_tokens=32)
    (folder / "runs" / f"{RUN}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


def servers(folder: Path) -> list[dict]:
    jobs = folder / "state" / "jobs"
    found = [json.loads(path.read_text()) for path in sorted(jobs.glob("*.json"))]
    return [record for record in found if record["name"] == "vllm-server" and record["run"] == RUN]


def pipeline(folder: Path, src: Path) -> dict:
    started = time.perf_counter()
    code, summary, stderr = agent(folder, src, "pipeline", "--run", RUN)
    seconds = time.perf_counter() - started
    (folder / "pipeline.stderr").write_text(stderr)
    if code != 0:
        raise SystemExit(f"pipeline with {src} exited {code}: {json.dumps(summary)[:1500]}\n{stderr[-3000:]}")
    records = servers(folder)
    ready = {job: float(value) for value, job in _READY.findall(stderr)}
    left = [record["id"] for record in records if record["state"] in ("pending", "running")]
    report = (summary.get("evaluation") or {}).get("report") or {}
    return {"starts": len(records), "loading_s": round(sum(ready.get(r["id"], 0.0) for r in records), 1),
            "pipeline_s": round(seconds, 1), "speedup": report.get("speedup"),
            "acceptance": report.get("mean_acceptance_length"), "left_running": left}


def stop_left(folder: Path, src: Path) -> None:
    agent(folder, src, "job", "stop", "vllm-server", "--run", RUN)


_BASELINE = """
import json, sys
from pathlib import Path
from specops.pipeline.run import Run
from specops.pipeline.evaluation.prompts import heldout_token_ids
from specops.pipeline.evaluation.served import run_prompts
from specops.pipeline.vllm import generating_server
run = Run(sys.argv[1], Path(sys.argv[2]))
prompts = heldout_token_ids(run, None)
server = generating_server(run)
rates = [run_prompts(server["endpoint"], server["model"], prompts, run.config.evaluate.max_tokens, 3,
                     speculative=False)["tokens_per_s"] for _ in range(2)]
server["server"].stop("bench done")
print(json.dumps({"tokens_per_s": rates}))
"""


def dedicated_baseline(folder: Path) -> float:
    env = {**os.environ, **ENV, "SPECOPS_WORKDIR": str(folder), "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", _BASELINE, RUN, str(folder)], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"the dedicated baseline failed: {done.stderr[-3000:]}")
    return max(json.loads(done.stdout.strip().splitlines()[-1])["tokens_per_s"])


def patch_serve_env() -> None:
    """The serve env (.venv-vllm) with the vLLM patch set applied, as the tests' session does (idempotent)."""
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"{VLLM_PYTHON} is absent: run scripts/setup-vllm.sh")
    state = VLLM_PYTHON.parent.parent / "specops-workdir"
    state.mkdir(exist_ok=True)
    agent(state, REPO / "src", "patch", "apply", "--set", PATCH_SET, "--patches-dir", str(REPO / "patches"),
          python=VLLM_PYTHON)


def digests(folder: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.glob("hs_*"))}


def dedicated_extraction(folder: Path) -> tuple[int, int]:
    """(files equal, files) after extracting the same rows again through a server of their own."""
    hidden = folder / "runs" / RUN / "hidden_states"
    shared = digests(hidden)
    for path in hidden.glob("hs_*"):
        path.unlink()
    code, document, stderr = agent(folder, REPO / "src", "step", "extract", "--run", RUN, "--stop-server")
    if code != 0:
        raise SystemExit(f"the dedicated extraction failed: {json.dumps(document)[:1500]}\n{stderr[-3000:]}")
    again = digests(hidden)
    return sum(1 for name, digest in shared.items() if again.get(name) == digest), len(shared)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE,
                        help="the agent before: a git revision, or a folder holding its src/ (default %(default)s)")
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--no-before", action="store_true", help="only this tree")
    args = parser.parse_args()
    patch_serve_env()
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-loads-") as tmp:
        root = Path(tmp)
        if not args.no_before:
            old = root / "before-src"
            if Path(args.before, "src", "specops").is_dir():  # a checkout (or an exported tree) of the before
                old = Path(args.before)
            else:
                old.mkdir()
                archive = subprocess.run(["git", "archive", args.before, "src"], cwd=REPO, capture_output=True,
                                         check=True)
                subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
            before = workdir(root / "before", args.samples, args.epochs)
            rows[f"before ({args.before})"] = pipeline(before, old / "src")
            stop_left(before, old / "src")
        after = workdir(root / "after", args.samples, args.epochs)
        rows["after (this tree)"] = pipeline(after, REPO / "src")
        show(rows, args)
        recorded = json.loads((after / "runs" / RUN / "served_baseline.json").read_text())["tokens_per_s"]
        dedicated = dedicated_baseline(after)
        print(f"\nthe target alone (evaluate's baseline): {recorded} tokens/s on the extraction server during "
              f"extract, {dedicated} on a dedicated target-alone server (best of 2): ratio {recorded / dedicated:.3f}")
        equal, files = dedicated_extraction(after)
        print(f"hidden-state files equal (sha256) to a dedicated extraction server's: {equal} of {files}")
        shutil.rmtree(root, ignore_errors=True)


def show(rows: dict[str, dict], args: argparse.Namespace) -> None:
    print(f"\nthe tiny run, backend vllm, {args.samples} samples, {args.epochs} epochs, regenerate + parity gate's "
          "served check + evaluate (8 held-out prompts, 32 tokens)")
    print(f"{'':22} {'server starts':>13} {'s loading':>10} {'pipeline s':>11} {'speedup':>8} {'acceptance':>10}  "
          "left running")
    for name, row in rows.items():
        print(f"{name:22} {row['starts']:>13} {row['loading_s']:>10} {row['pipeline_s']:>11} {row['speedup']!s:>8} "
              f"{row['acceptance']!s:>10}  {', '.join(row['left_running']) or '-'}", flush=True)
    if len(rows) == 2:
        first, second = rows.values()
        print(f"after / before: starts {second['starts'] / first['starts']:.2f}, seconds loading "
              f"{second['loading_s'] / max(first['loading_s'], 1e-9):.2f}, pipeline "
              f"{second['pipeline_s'] / first['pipeline_s']:.2f}", flush=True)


if __name__ == "__main__":
    main()
