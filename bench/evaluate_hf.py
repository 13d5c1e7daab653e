"""The hf evaluation's replay against an older replay.py, side by side, on a finished tiny run.

    PYTHONPATH=src python bench/evaluate_hf.py --workdir WD --before OLD.py [--n 3] [--prompts 20]

WD is a workdir after `invoke pipeline` (or `python -m specops pipeline --run tiny`): its trained
checkpoint (the best; the untrained draft is made beside the evaluation if missing); OLD.py an older
replay module (e.g. `git show 56ba73a~1:src/specops/pipeline/evaluation/replay.py > OLD.py`). Each
round scores the trained and the untrained draft with both, in turn, in one process with one torch
thread (as specops runs CPU jobs), on the same target, prompts and drafts; prints the median seconds
per evaluation, the ratio, and whether the counts agree. Asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=20)
    args = parser.parse_args()
    os.environ["SPECOPS_WORKDIR"] = str(args.workdir)

    import torch

    torch.set_num_threads(1)
    from specops.pipeline.evaluation import replay as after
    from specops.pipeline.evaluation.drafts import UNTRAINED, untrained_draft
    from specops.pipeline.evaluation.step import heldout_token_ids
    from specops.pipeline.run import Run
    from specops.pipeline.target import load_target

    before = load_module(args.before, "replay_before")
    run = Run("tiny", args.workdir)
    prompts = heldout_token_ids(run, args.prompts)
    target = load_target(run, torch.device("cpu"), torch.float32)
    k, max_tokens = run.config.evaluate.num_speculative_tokens, run.config.evaluate.max_tokens
    best = (run.paths.checkpoints / "checkpoint_best").resolve()
    drafts = [best, untrained_draft(best, run.model_path, run.paths.evaluation / UNTRAINED)]

    def evaluation_before() -> list[dict]:
        return [before.replay(run, draft, prompts, k, max_tokens, target=target) for draft in drafts]

    def evaluation_after() -> list[dict]:
        answers: dict[int, list[int]] = {}  # as evaluate's Scorer shares them between its drafts
        return [after.replay(run, draft, prompts, k, max_tokens, target=target, answers=answers) for draft in drafts]

    times: dict[str, list[float]] = {"before": [], "after": []}
    counts: dict[str, list[dict]] = {}
    evaluation_after()  # warm-up
    for _ in range(args.n):
        for name, evaluate in (("before", evaluation_before), ("after", evaluation_after)):
            began = time.perf_counter()
            counts[name] = evaluate()
            times[name].append(time.perf_counter() - began)
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"hf evaluation of 2 drafts (trained, untrained) on {len(prompts)} held-out prompts, k={k}, "
          f"{max_tokens} tokens, one thread, n={args.n}")
    for name in ("before", "after"):
        print(f"  {name:6s} {median[name]:7.2f} s  (rounds: {', '.join(f'{t:.2f}' for t in times[name])})")
    print(f"  after / before: {median['after'] / median['before']:.3f}  "
          f"({median['before'] / median['after']:.1f}x faster)")
    agree = all(a["num_accepted_tokens"] == b["num_accepted_tokens"] and a["num_drafts"] == b["num_drafts"]
                for a, b in zip(counts["before"], counts["after"], strict=True))
    print(f"  same counts: {agree} " + "; ".join(
        f"{c['num_accepted_tokens']}/{c['num_draft_tokens']}" for c in counts["after"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
