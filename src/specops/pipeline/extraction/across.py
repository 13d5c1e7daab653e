"""Extraction over K hosts: host i writes share i of the one-host plan, every share reaches every host
that lacks rows (the engine's exchange), then every host checks all N files whole before anything
trains. hf shares are whole batches of the one-host plan (the files are the bytes one host writes);
vllm shares are speculators' own `--rank I --world-size K`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specops.pipeline.shares import shares_fit

if TYPE_CHECKING:
    from specops.pipeline.run import StepContext, StepReport


def across_hosts(context: StepContext) -> StepReport:
    from specops.pipeline.extraction import Options, extract

    run, hosts = context.run, context.hosts
    # node i's server listens on vllm.port + i: hosts that share one machine (two inventory entries of one
    # box, the tests' loopback hosts) never collide; on separate machines it changes nothing
    port = run.config.vllm.port + hosts.rank if context.backend == "vllm" else None
    report = extract(run, context.samples, context.backend, Options(part=(hosts.rank, hosts.count), port=port))
    share = report["part"]
    written = report.get("counts", {}).get("written", 0)
    plans = hosts.all_gather("extract-plan", {**share, "status": report["status"], "written": written})
    shares_fit("extract", plans, hosts.names, "samples", "target, data, dtype or device")
    rows = [row for start, stop in share["spans"] for row in range(int(start), int(stop))]
    lacking = not share["others_whole"]
    exchanged = (hosts.exchange("extract", run.paths.hidden_states, [f"hs_{row}.safetensors" for row in rows], lacking)
                 if any(not plan["others_whole"] for plan in plans) else {"copies": [], "bytes": 0})
    whole = extract(run, context.samples, context.backend, Options(require_whole=True))
    return {**whole, "part": share, "share_status": report["status"], "written": written,
            "shares": dict(zip(hosts.names, plans, strict=True)), "exchanged": exchanged}
