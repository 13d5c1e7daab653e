"""Wall time of `python -m specops doctor` on speculators 0.3.0 × vLLM 0.16.0, cold and warm.

The host is built as the doctor tests build it: both wheels' Python sources unpacked into one site
folder, passed with `--site`, with this interpreter's own site-packages (torch, transformers,
pydantic) after it. A Kimi-K2.5-shaped run (`KimiK25ForConditionalGeneration`, `text_config`, a
tokenizer with `auto_map`) is checked, import probe included.

- cold: an empty analysis cache (SPECOPS_ANALYSIS_CACHE in a fresh folder) for every run;
- warm: the same cache, already filled by a first run.

Prints the best and median of several runs next to `python -c pass` and the load average, since the
targets (cold ≤ 10 s, warm ≤ 2 s) are for a quiet 2-core machine.

    .venv/bin/python bench/doctor.py [--runs 3] [--no-import]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testing.wheels import site_with  # noqa: E402  (needs the repo root on the path)

KIMI = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": {"num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 163840}}
TOKENIZER = {"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}, "chat_template": "x"}


CPU: list[float] = []  # user + system seconds of each run (the doctor and its import probe child)


def run_once(command: list[str], cache: Path) -> tuple[float, dict]:
    env = {**os.environ, "SPECOPS_ANALYSIS_CACHE": str(cache), "PYTHONPATH": str(REPO / "src")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall, json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-import", action="store_true", help="leave the import probe out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-doctor-") as scratch:
        root = Path(scratch)
        site = site_with(root / "site", ("speculators", "0.3.0"), ("vllm", "0.16.0"))
        model = root / "kimi"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(KIMI))
        (model / "tokenizer_config.json").write_text(json.dumps(TOKENIZER))
        run = json.dumps({"model_path": str(model), "trust_remote_code": True})
        command = [sys.executable, "-m", "specops", "doctor", "--site", str(site), "--run-json", run]
        command += ["--no-import"] if args.no_import else []
        baseline = min(run_once([sys.executable, "-c", "print('{}')"], root / "none")[0] for _ in range(3))
        cold, warm, errors = [], [], 0
        cold_cpu, warm_cpu = [], []
        for index in range(args.runs):
            wall, document = run_once(command, root / f"cold-{index}")
            cold.append(wall)
            cold_cpu.append(CPU[-1])
            errors = sum(1 for f in document["findings"] if f["result"] == "error")
        run_once(command, root / "warm")
        for _ in range(args.runs):
            wall, document = run_once(command, root / "warm")
            warm.append(wall)
            warm_cpu.append(CPU[-1])
            assert all(document["cache"].values()), document["cache"]
        load = os.getloadavg()
    print(f"doctor, speculators 0.3.0 × vLLM 0.16.0, Kimi-shaped run{' (no import probe)' if args.no_import else ''}:"
          f" {errors} errors found")
    print(f"load average (1, 5, 15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    # CPU seconds are steadier than wall time on a shared machine; the probe runs beside the analysis,
    # so on an idle 2-core machine the wall time is about the larger of the two, not their sum
    print("| measurement | best wall s | median wall s | median CPU s | target wall s | best / python -c |")
    print("|---|---|---|---|---|---|")
    for name, values, cpu, target in (("cold (empty cache)", cold, cold_cpu, 10.0),
                                      ("warm (cache filled)", warm, warm_cpu, 2.0)):
        print(f"| {name} | {min(values):.2f} | {statistics.median(values):.2f} | {statistics.median(cpu):.2f} | "
              f"{target:.0f} | {min(values) / baseline:.1f} |")
    print(f"| python -c (interpreter start) | {baseline:.2f} | | | | 1.0 |")


if __name__ == "__main__":
    main()
