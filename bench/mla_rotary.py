"""vLLM's CPU rotary kernel on an MLA target, side by side: the tiny Kimi text model (DeepseekV3, MLA at 512 + 64)
through the vllm backend with the server specops builds (vLLM's native rotary) and with the kernel kept (the run's
own `--compilation-config {"custom_ops":["all"]}`, what --enforce-eager alone gives). For each: the pipeline,
its validate (fidelity against the server's own next-token choices, batched as extraction sends them) and
`step validate --reference hf` (against a transformers forward), and the hf replay's acceptance of the draft
trained on those states (specops/doctor/_cpu_rotary.py says why).

    .venv/bin/python bench/mla_rotary.py [--samples 24] [--epochs 2] [--workdir DIR]

Needs .venv-vllm (scripts/setup-vllm.sh). ~3 min a side on 2 cores at 24 samples.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

from testing.agent import run_agent  # noqa: E402
from testing.runs import edit_run  # noqa: E402
from testing.vllm import VLLM_PYTHON, free_port  # noqa: E402

RUN = "tiny-kimi-text"
KERNEL_KEPT = ["--compilation-config", '{"custom_ops":["all"]}']


def workdir(root: Path, samples: int, epochs: int, serve_args: list[str]) -> Path:
    import yaml

    shutil.copytree(REPO / "runs", root / "runs")
    (root / "patches").symlink_to(REPO / "patches")
    path = root / "runs" / f"{RUN}.yaml"
    own = yaml.safe_load(path.read_text())["vllm"]["serve_args"]
    edit_run(path, samples=samples, vllm={"port": free_port(), "serve_args": own + serve_args},
             train={"epochs": epochs}, evaluate={"epoch_prompts": 0})
    return root


def agent(root: Path, *args: str) -> tuple[int, dict, float]:
    started = time.perf_counter()
    code, document, _stderr = run_agent(root, *args, timeout=3600, env={
        "SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON), "VLLM_CPU_KVCACHE_SPACE": "1"})
    return code, document, time.perf_counter() - started


def side(root: Path, samples: int, epochs: int, serve_args: list[str]) -> dict:
    workdir(root, samples, epochs, serve_args)
    code, _summary, seconds = agent(root, "pipeline", "--run", RUN)
    run = root / "runs" / RUN
    report = run / "validate_report.json"
    fidelity = json.loads(report.read_text())["checks"]["fidelity"] if report.is_file() else {}
    row = {"pipeline_exit": code, "pipeline_s": round(seconds, 1),
           "fidelity_own_choices": (fidelity.get("detail") or {}).get("agreement")}
    if code == 1 and not fidelity.get("ok", True):  # validate stopped the run: train on what was extracted
        for step in ("vocab", "train", "evaluate"):
            agent(root, "step", step, "--run", RUN)
    _code, against_hf, _seconds = agent(root, "step", "validate", "--run", RUN, "--reference", "hf")
    row["fidelity_transformers"] = ((against_hf.get("checks") or {}).get("fidelity", {}).get("detail") or {}).get(
        "agreement")
    evaluation = run / "evaluation" / "report.json"
    if evaluation.is_file():
        document = json.loads(evaluation.read_text())
        row["trained"] = document["report"]["mean_acceptance_length"]
        row["untrained"] = document["untrained"]["mean_acceptance_length"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    base = args.workdir or Path(tempfile.mkdtemp(prefix="mla-rotary-"))
    rows = {"native rotary (specops)": side(base / "native", args.samples, args.epochs, []),
            "CPU rotary kernel kept": side(base / "kernel", args.samples, args.epochs, KERNEL_KEPT)}
    keys = ("pipeline_exit", "pipeline_s", "fidelity_own_choices", "fidelity_transformers", "trained", "untrained")
    print("| server | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(str(row.get(key, "-")) for key in keys) + " |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
