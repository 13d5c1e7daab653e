"""The pipeline's `patches` step: apply and verify the patch sets that fit this host (e.g. the CPU
training shims on CPU hosts). Across hosts, the hosts take turns: hosts sharing one package folder
(an NFS home) never race on it."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from specops.errors import CheckFailed

if TYPE_CHECKING:
    from specops.pipeline.run import StepContext, StepReport


def apply_and_verify() -> dict[str, Any]:
    from specops.patching import apply_sets, verify_sets

    applied = apply_sets()
    for entry in applied["sets"]:
        if entry.get("applicable"):
            print(f"specops: patch set {entry['name']}: {entry.get('result')} — {entry.get('detail')}",
                  file=sys.stderr, flush=True)
    if not applied["ok"]:
        raise CheckFailed("applying patch sets failed: " + "; ".join(
            entry.get("detail", "") for entry in applied["sets"] if not entry.get("ok")))
    verified = verify_sets()
    failing = [check for check in verified.get("checks", []) if not check["ok"]]
    if failing:
        raise CheckFailed("patch verify failed: " + "; ".join(f"{c.get('check')}: {c.get('detail')}" for c in failing))
    sets = [entry["name"] for entry in applied["sets"] if entry.get("applicable")]
    return {"status": "ok", "sets": sets, "checks": len(verified.get("checks", []))}


def pipeline_step(context: StepContext) -> StepReport:
    hosts = context.hosts
    report: dict[str, Any] = {}
    for turn in range(hosts.count):
        if turn == hosts.rank:
            report = apply_and_verify()
        hosts.barrier(f"patches-{turn}")
    return report
