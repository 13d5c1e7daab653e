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

    python bench/serving_compare.py --merge A.json B.json ...

one table from documents of kinds compared one at a time on the same run, machine and settings (`--out` of each;
bench/gpu_issue57.sh compares each kind on its own so that a cut-off keeps the kinds done): the speedups against
`none` and the best at each concurrency recomputed by the agent's own code. Refuses documents whose prompts, sets,
tokens, k or concurrency differ.
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
    parser.add_argument("--merge", nargs="+", type=Path, metavar="JSON", help="one table from per-kind documents")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--run")
    parser.add_argument("--compare", default="none,ngram,suffix,eagle3")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--rounds", type=int, default=None, help="rounds at each concurrency (default: the agent's)")
    parser.add_argument("--prompts", type=int, default=None, help="the first N held-out prompts and of each set")
    parser.add_argument("--checkpoint", default=None, help="best | last | an epoch (default: evaluate.checkpoint)")
    parser.add_argument("--out", type=Path, default=None, help="write the comparison's document here too")
    args = parser.parse_args()
    if args.merge:
        merge(args.merge)
        return
    if args.workdir is None or args.run is None:
        parser.error("--workdir and --run are required (or --merge)")
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


SAME = ("backend", "prompts", "sets", "max_tokens", "num_speculative_tokens", "concurrency", "rounds")


def merge(paths: list[Path]) -> None:
    from specops.pipeline.evaluation.compare import _speedups, best_kinds, table_lines

    documents = [json.loads(path.read_text()) for path in paths]
    first = documents[0]
    for path, document in zip(paths[1:], documents[1:], strict=True):
        differ = [key for key in SAME if document.get(key) != first.get(key)]
        if differ:
            raise SystemExit(f"{path}: {', '.join(differ)} differ from {paths[0]}'s: not one comparison")
    rows = [row for document in documents for row in document["rows"]]
    _speedups(rows, first["concurrency"])
    merged = {**first, "kinds": [row["label"] for row in rows], "rows": rows,
              "best": best_kinds(rows, first["concurrency"]),
              "servers": [server for document in documents for server in document["servers"]]}
    merged.pop("speedup_note", None)
    if not any(row["kind"] == "none" for row in rows):
        merged["speedup_note"] = "not measured: `none` (the target alone) is not among the kinds compared"
    for line in table_lines(merged):
        print(line)
    ready = ", ".join(f"{server['label']} {server['ready_s']} s" for server in merged["servers"])
    print(f"\n{len(merged['servers'])} servers ({ready}), from {len(paths)} documents")


if __name__ == "__main__":
    main()
