"""Hidden-state backends side by side on the tiny model: `hidden_states.backend: file` against `fp8` (speculators'
hs_connectors FP8 format: float8_e4m3fn states and one float32 scale per token), each a whole pipeline of the tiny
run on the same prepared rows. For each: the hidden-state folder's bytes on disk, validate's fidelity (the final
captured layer, read back dequantised, through the target's norm and head against its own next-token choices:
agreement at the decidable positions and at all positions) and the trained draft's mean acceptance length (the
evaluate step), then the ratios fp8 / file.

    .venv/bin/python bench/hidden_state_backends.py [--samples 80] [--epochs 2] [--backend hf|vllm] [--workdir DIR]

hf (default) extracts in process with transformers, fp8 quantised with hs_connectors' own quantize_tensor_to_fp8;
vllm extracts through the run's vLLM server with the backend's own connector (needs .venv-vllm).
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

RUN = "tiny"


def side(root: Path, backend: str, extraction: str, samples: int, epochs: int) -> dict:
    shutil.copytree(REPO / "runs", root / "runs")
    (root / "patches").symlink_to(REPO / "patches")
    edit_run(root / "runs" / f"{RUN}.yaml", samples=samples, backend=extraction,
             hidden_states={"backend": backend}, train={"epochs": epochs}, vllm={"port": free_port()})
    started = time.perf_counter()
    code, _summary, stderr = run_agent(root, "pipeline", "--run", RUN, timeout=3600, env={
        "SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON), "VLLM_CPU_KVCACHE_SPACE": "1"})
    run = root / "runs" / RUN
    files = sorted((run / "hidden_states").glob("hs_*.safetensors"))
    row: dict = {"pipeline_exit": code, "pipeline_s": round(time.perf_counter() - started, 1),
                 "files": len(files), "disk_bytes": sum(path.stat().st_size for path in files)}
    if code != 0:
        row["error"] = stderr.strip().splitlines()[-1:] or None
    report = run / "validate_report.json"
    if report.is_file():
        detail = json.loads(report.read_text())["checks"]["fidelity"]["detail"]
        row.update(fidelity=detail.get("agreement"), fidelity_all=detail.get("agreement_all_positions"),
                   decidable=f"{detail.get('decidable')}/{detail.get('positions')}", threshold=detail.get("threshold"))
    evaluation = run / "evaluation" / "report.json"
    if evaluation.is_file():
        document = json.loads(evaluation.read_text())
        row["acceptance"] = document["report"]["mean_acceptance_length"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=80)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf", help="the extraction backend")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    base = args.workdir or Path(tempfile.mkdtemp(prefix="hs-backends-"))
    rows = {name: side(base / name, name, args.backend, args.samples, args.epochs) for name in ("file", "fp8")}
    keys = ("pipeline_exit", "pipeline_s", "files", "disk_bytes", "fidelity", "fidelity_all", "decidable",
            "threshold", "acceptance")
    print(f"extraction: {args.backend}, {args.samples} samples, {args.epochs} epochs")
    print("| backend | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(str(row.get(key, "-")) for key in keys) + " |")
    file, fp8 = rows["file"], rows["fp8"]
    for key in ("disk_bytes", "fidelity_all", "acceptance"):
        if file.get(key) and fp8.get(key) is not None:
            print(f"fp8 / file {key}: {fp8[key] / file[key]:.3f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
