"""What a server kept between steps run by hand is worth (issue 54), on the tiny run with `backend: vllm`.

    python bench/step_reuse.py [--root DIR]

Two fresh tiny workdirs run the same steps by hand, each its own agent command (`python -m specops step X`,
as `invoke X` runs it in a job): extract 6 rows, validate, extract 8 rows, vocab, train 1 epoch, evaluate
(vllm, 4 prompts); once with `vllm.keep_server: false` (the default: each step's server stops with it) and
once with `true` (the server outlives each step; the next step reuses it where it serves the same). For
each step: its seconds, the server loads it made (its document's `vllm_servers.starts`) and, for validate,
the fidelity check's reference (vllm: the kept server; hf: the transformers target). Needs .venv-vllm.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testing.agent import run_agent  # noqa: E402
from testing.runs import edit_run  # noqa: E402
from testing.vllm import VLLM_PYTHON, free_port, tiny_workdir  # noqa: E402

ENV = {"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON), "VLLM_CPU_KVCACHE_SPACE": "1"}
STEPS = [("extract", "--samples", "6"), ("validate", "--fidelity-samples", "2"), ("extract", "--samples", "8"),
         ("vocab",), ("train", "--epochs", "1"), ("evaluate", "--backend", "vllm", "--prompts", "4")]


def by_hand(root: Path, keep: bool) -> list[dict]:
    folder = tiny_workdir(root, free_port())
    os.symlink(REPO / "patches", folder / "patches")
    edit_run(folder / "runs" / "tiny.yaml", vllm={"keep_server": keep}, train={"epochs": 1},
             evaluate={"heldout_prompts": 4})
    rows = []
    try:
        for step in STEPS:
            started = time.monotonic()
            code, document, stderr = run_agent(folder, "step", step[0], *step[1:], "--run", "tiny", env=ENV,
                                               timeout=1800)
            if code != 0:
                raise SystemExit(f"step {' '.join(step)}: exit {code}: {json.dumps(document)[:1500]}\n{stderr[-3000:]}")
            fidelity = ((document.get("checks") or {}).get("fidelity") or {}).get("detail", {}).get("reference")
            rows.append({"step": " ".join(step), "seconds": round(time.monotonic() - started, 1),
                         "loads": (document.get("vllm_servers") or {}).get("starts", 0), "fidelity": fidelity})
            print(f"keep_server {str(keep).lower():5}  {rows[-1]}", flush=True)
    finally:
        run_agent(folder, "job", "stop", "vllm-server", "--run", "tiny")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None, help="where the two workdirs go (default: a temp dir)")
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="step-reuse-"))
    table = {keep: by_hand(root / f"keep-{keep}", keep) for keep in (False, True)}
    print(f"\n{'step':40} {'keep_server: false':>22} {'keep_server: true':>22}")
    for off, on in zip(table[False], table[True], strict=True):
        cells = [f"{row['seconds']} s, {row['loads']} load(s)" + (f", {row['fidelity']}" if row["fidelity"] else "")
                 for row in (off, on)]
        print(f"{off['step']:40} {cells[0]:>22} {cells[1]:>22}")
    for keep, rows in table.items():
        print(f"keep_server {str(keep).lower()}: {sum(row['loads'] for row in rows)} loads, "
              f"{round(sum(row['seconds'] for row in rows), 1)} s")


if __name__ == "__main__":
    main()
