"""Which speculator serves a finished run's target best: `evaluate --compare` on it, and the table it gives.

    PYTHONPATH=src python bench/serving_compare.py --workdir WD --run R [--compare none,ngram,suffix,eagle3]
        [--concurrency 1,8] [--rounds 3] [--prompts N] [--checkpoint best|last|N] [--out compare.json]

Runs the agent's own command, as `invoke evaluate --compare` starts it on a host (`python -m specops step
evaluate --run R --backend vllm --compare ...`), in WD with the serve env in SPECOPS_SERVE_PYTHON (default
.venv-vllm): one vLLM server per servable kind, the same prompts (the run's held-out prompts and its
evaluate.sets, the first --prompts of each; default: the run's evaluate.set_prompts) and the same server flags for
each. Prints the table (acceptance per set, tokens/s and speedup against none at each concurrency, the best with
its margin), where the plot is, the loads and the wall time. WD must hold a run whose training has finished.
The kinds run one after another on one machine: on a shared one, run it twice and compare before believing a
few per cent. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))  # the table is rendered here by the agent's own code (no PYTHONPATH needed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--run", required=True)
    parser.add_argument("--compare", default="none,ngram,suffix,eagle3")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--rounds", type=int, default=None, help="rounds at each concurrency (default: the agent's)")
    parser.add_argument("--prompts", type=int, default=None, help="the first N held-out prompts and of each set")
    parser.add_argument("--checkpoint", default=None, help="best | last | an epoch (default: evaluate.checkpoint)")
    parser.add_argument("--out", type=Path, default=None, help="write the comparison's document here too")
    args = parser.parse_args()
    env = {**os.environ, "SPECOPS_WORKDIR": str(args.workdir.resolve()),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    env.setdefault("SPECOPS_SERVE_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    argv = [sys.executable, "-m", "specops", "step", "evaluate", "--run", args.run, "--backend", "vllm",
            "--compare", args.compare, "--concurrency", args.concurrency]
    if args.prompts:
        argv += ["--prompts", str(args.prompts)]
    if args.checkpoint:
        argv += ["--checkpoint", args.checkpoint]
    if args.rounds:
        argv += ["--rounds", str(args.rounds)]
    print(f"$ {' '.join(argv[1:])}  (in {args.workdir})", flush=True)
    started = time.monotonic()
    done = subprocess.run(argv, cwd=args.workdir, env=env, stdout=subprocess.PIPE, text=True)
    seconds = time.monotonic() - started
    lines = done.stdout.strip().splitlines()
    document = json.loads(lines[-1]) if lines else {}
    if done.returncode != 0 or "compare" not in document:
        raise SystemExit(f"evaluate --compare failed (exit {done.returncode}): {document.get('error')}")
    from specops.pipeline.evaluation.compare import table_lines

    compared = document["compare"]
    sets = ", ".join(f"{name} ({info['conversations']} conversations)" for name, info in compared["sets"].items())
    version = (compared["servers"] or [{}])[0].get("vllm_version")
    print(f"\n{args.run}: {compared['prompts']} held-out prompts, sets {sets or 'none'}, {compared['max_tokens']} "
          f"tokens each, k={compared['num_speculative_tokens']}, vLLM {version}")
    for line in table_lines(compared):
        print(line)
    loads = sum(1 for server in compared["servers"] if not server.get("reused"))
    ready = ", ".join(f"{server['label']} {server['ready_s']} s" for server in compared["servers"])
    print(f"\n{loads} server loads ({ready}); {seconds:.0f} s in all; plot {compared['plot']}")
    if args.out:
        args.out.write_text(json.dumps(compared, indent=1))
        print(f"document: {args.out}")


if __name__ == "__main__":
    main()
