"""The real model end to end (issue 51): runs/smollm2.yaml through `invoke pipeline` on the `local` host, with its
figures: each step's time, the per-set table (trained, untrained, per position) and the issue's goal.

    bash scripts/setup-real.sh && bash scripts/setup-vllm.sh
    python bench/real_model.py --workdir /tmp/real --launch          # the pipeline, then its figures
    python bench/real_model.py --workdir /tmp/real                    # the figures of a run already finished there

--launch writes WORKDIR/inventory.yaml (the `local` host: this checkout's .venv, the serve env .venv-vllm when it
is there, workdir WORKDIR/local) and runs `invoke pipeline --run RUN --json` with it, timed; the summary goes to
WORKDIR/pipeline.json. Without --launch, the summary is that file, or (a run started with --detach) the run's
evaluation report and its job log on the host. Step times come from the pipeline job's log ("STEP: done in N s").
Goal (issue 51, CPU): on MT-Bench, trained >= untrained + 0.3 at k=3. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEP_DONE = re.compile(r"^(?:specops: )?(\w+): (\S.*?) in ([\d.]+) s$")
GOAL_SET, GOAL_MARGIN = "mtbench", 0.3


def inventory(workdir: Path) -> Path:
    serve = REPO / ".venv-vllm" / "bin" / "python"
    lines = ["default: local", "hosts:", "  local:", "    connection: local", f"    workdir: {workdir / 'local'}",
             f"    python: {REPO / '.venv' / 'bin' / 'python'}", "    gpus: 0"]
    if serve.is_file():
        lines.append(f"    envs: {{serve: {serve}}}")
    path = workdir / "inventory.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def launch(workdir: Path, run: str) -> dict:
    env = {**os.environ, "SPECOPS_INVENTORY": str(inventory(workdir))}
    started = time.perf_counter()
    done = subprocess.run([str(REPO / ".venv" / "bin" / "invoke"), "pipeline", "--run", run, "--json"], cwd=REPO,
                          env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    print(done.stderr[-3000:], file=sys.stderr)
    summary = json.loads(done.stdout) if done.stdout.strip() else {"ok": False, "exit_code": done.returncode}
    summary["bench_wall_s"] = round(seconds, 1)
    (workdir / "pipeline.json").write_text(json.dumps(summary, indent=2))
    return summary


def step_times(workdir: Path, run: str) -> dict[str, float]:
    """Each step's seconds from the newest pipeline job log of the run on the host (what `invoke logs` shows)."""
    logs = sorted((workdir / "local" / "logs").glob("pipeline-*.log"), key=lambda path: path.stat().st_mtime)
    times: dict[str, float] = {}
    for log in logs:
        text = log.read_text(errors="replace")
        if f"run {run}" not in text and f"--run {run}" not in text and f"runs/{run}" not in text:
            continue
        for line in text.splitlines():
            found = STEP_DONE.match(line.strip())
            if found and found.group(2).startswith(("done", "ok", "skipped", "vLLM only")):
                times[found.group(1)] = float(found.group(3))
    return times


def evaluation(workdir: Path, run: str) -> dict:
    summary_file = workdir / "pipeline.json"
    if summary_file.is_file():
        summary = json.loads(summary_file.read_text())
        if summary.get("evaluation"):
            return summary["evaluation"]
    report = workdir / "local" / "runs" / run / "evaluation" / "report.json"
    return json.loads(report.read_text()) if report.is_file() else {}


def per_position(figures: dict) -> str:
    return " / ".join(f"{value:.3f}" for value in figures.get("per_position_acceptance") or []) or "-"


def print_figures(workdir: Path, run: str) -> None:
    times = step_times(workdir, run)
    if times:
        print("step times (s): " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in times.items())
              + f"; all {sum(times.values()):.1f}")
    found = evaluation(workdir, run)
    if not found:
        print(f"no evaluation of run {run} under {workdir}")
        return
    rows = [("held-out", found.get("report") or {}, found.get("untrained") or {})]
    rows += [(name, entry.get("trained") or {}, entry.get("untrained") or {})
             for name, entry in (found.get("sets") or {}).items()]
    print(f"{'set':<12} {'prompts':>7} {'trained':>8} {'untrained':>9}  per position (trained)")
    for name, trained, untrained in rows:
        print(f"{name:<12} {trained.get('prompts', '-')!s:>7} {trained.get('mean_acceptance_length') or 0:>8.3f} "
              f"{untrained.get('mean_acceptance_length') or 0:>9.3f}  {per_position(trained)}")
    goal = (found.get("sets") or {}).get(GOAL_SET)
    if goal:
        trained = goal["trained"]["mean_acceptance_length"]
        untrained = goal["untrained"]["mean_acceptance_length"]
        verdict = "met" if trained >= untrained + GOAL_MARGIN else "NOT met"
        print(f"goal: {GOAL_SET} trained {trained:.3f} >= untrained {untrained:.3f} + {GOAL_MARGIN}: {verdict}")
    speed = found.get("report", {}).get("speedup")
    if speed is not None:
        print(f"speedup of the draft against the target alone (the evaluation's own measure): {speed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--run", default="smollm2")
    parser.add_argument("--launch", action="store_true", help="run the pipeline first")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.launch:
        summary = launch(args.workdir.resolve(), args.run)
        print(f"invoke pipeline --run {args.run}: exit ok={summary.get('ok')}, {summary.get('bench_wall_s')} s")
    print_figures(args.workdir.resolve(), args.run)


if __name__ == "__main__":
    main()
