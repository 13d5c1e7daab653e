"""Extraction over K hosts: host i writes share i of the one-host plan, every share reaches every host
that lacks rows (the engine's exchange), then every host checks all N files whole before anything
trains. hf shares are whole batches of the one-host plan (the files are the bytes one host writes);
vllm shares are speculators' own `--rank I --world-size K`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specops.errors import CheckFailed

if TYPE_CHECKING:
    from specops.pipeline.run import StepContext


def same_extraction(plans: list[dict[str, Any]], names: list[str]) -> None:
    """Every host planned the same extraction (inputs, N): else the shares do not fit."""
    if len({(plan["inputs_hash"], plan["samples"]) for plan in plans}) > 1:
        shown = ", ".join(f"{name}: {plan['inputs_hash'][:12]} of {plan['samples']} rows"
                          for name, plan in zip(names, plans, strict=True))
        raise CheckFailed(f"extract across hosts: the hosts planned different extractions ({shown}); their "
                          "target, data, dtype or device differ, so their shares would not fit together")


def across_hosts(context: StepContext) -> dict[str, Any]:
    from specops.pipeline.extraction import Options, extract

    run, hosts = context.run, context.hosts
    # node i's server listens on vllm.port + i: hosts that share one machine (two inventory entries of one
    # box, the tests' loopback hosts) never collide; on separate machines it changes nothing
    port = run.config.vllm.port + hosts.rank if context.backend == "vllm" else None
    report = extract(run, context.samples, context.backend, Options(part=(hosts.rank, hosts.count), port=port))
    share = report["part"]
    written = report.get("counts", {}).get("written", 0)
    plans = hosts.all_gather("extract-plan", {**share, "status": report["status"], "written": written})
    same_extraction(plans, hosts.names)
    rows = [row for start, stop in share["spans"] for row in range(int(start), int(stop))]
    lacking = not share["others_whole"]
    exchanged = (hosts.exchange("extract", run.paths.hidden_states, [f"hs_{row}.safetensors" for row in rows], lacking)
                 if any(not plan["others_whole"] for plan in plans) else {"copies": [], "bytes": 0})
    whole = extract(run, context.samples, context.backend, Options(require_whole=True))
    return {**whole, "part": share, "share_status": report["status"], "written": written,
            "shares": dict(zip(hosts.names, plans, strict=True)), "exchanged": exchanged}
