"""The hf evaluation's replay against an older replay.py, side by side, on a finished tiny run.

    PYTHONPATH=src python bench/evaluate_hf.py --workdir WD --before OLD.py [--n 3] [--prompts 20]

WD is a workdir after `invoke pipeline` (or `python -m specops pipeline --run tiny`): its trained
checkpoint (the best; the untrained draft is made beside the evaluation if missing); OLD.py an older
replay module (e.g. `git show 56ba73a~1:src/specops/pipeline/evaluation/replay.py > OLD.py`). Each
round scores the trained and the untrained draft with both, in turn, in one process with one torch
thread (as specops runs CPU jobs), on the same target, prompts and drafts, sharing between the drafts
what each module's replay lets a caller share (the target's answers, its auxiliary states), then one
more draft with that kept (what each further epoch costs); prints the median seconds of both, the
ratios, and whether the counts agree. Asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
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

    shares = {"before": set(inspect.signature(before.replay).parameters) & {"answers", "states"},
              "after": {"answers", "states"}}
    modules = {"before": before, "after": after}

    def shared(name: str) -> dict:
        """Fresh dicts for what the module's replay shares between the drafts of one evaluation."""
        return {key: {} for key in shares[name]}

    def evaluation(name: str, kept: dict) -> list[dict]:
        return [modules[name].replay(run, draft, prompts, k, max_tokens, target=target, **kept) for draft in drafts]

    times: dict[str, list[float]] = {"before": [], "after": [], "before per draft": [], "after per draft": []}
    counts: dict[str, list[dict]] = {}
    evaluation("after", shared("after"))  # warm-up
    for _ in range(args.n):
        for name in ("before", "after"):
            kept = shared(name)
            began = time.perf_counter()
            counts[name] = evaluation(name, kept)
            times[name].append(time.perf_counter() - began)
            # one more draft of the same evaluation (another epoch): the target's work is kept
            began = time.perf_counter()
            modules[name].replay(run, drafts[0], prompts, k, max_tokens, target=target, **kept)
            times[f"{name} per draft"].append(time.perf_counter() - began)
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"hf evaluation of 2 drafts (trained, untrained) on {len(prompts)} held-out prompts, k={k}, "
          f"{max_tokens} tokens, one thread, n={args.n}")
    for name in times:
        print(f"  {name:16s} {median[name]:7.2f} s  (rounds: {', '.join(f'{t:.2f}' for t in times[name])})")
    for what in ("", " per draft"):
        ratio = median[f"after{what}"] / median[f"before{what}"]
        print(f"  after / before{what or ' (evaluation)'}: {ratio:.3f}  ({1 / ratio:.1f}x faster)")
    agree = all(a["num_accepted_tokens"] == b["num_accepted_tokens"] and a["num_drafts"] == b["num_drafts"]
                and a["accepted_per_position"] == b["accepted_per_position"]
                for a, b in zip(counts["before"], counts["after"], strict=True))
    print(f"  same counts: {agree}; accepted/drafted before " + "; ".join(
        f"{c['num_accepted_tokens']}/{c['num_draft_tokens']}" for c in counts["before"]) + ", after " + "; ".join(
        f"{c['num_accepted_tokens']}/{c['num_draft_tokens']}" for c in counts["after"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
