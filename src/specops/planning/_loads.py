"""The model loads a run will make, each with its estimated time, and their total.

A load is the most expensive thing the pipeline does (18 minutes for Kimi-K2.5 on 8 GPUs): the plan lists
them before any is made. A load's time is the target's weight bytes over the host's read rate: given
(the run config's plan.load_seconds, or plan.load_gb_per_s), else measured by this run's earlier loads on
the host (seconds to ready, recorded in their job records), else unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specops.planning._sizes import GB


@dataclass(frozen=True)
class Load:
    serves: str   # what the server serves (the target capturing hidden states, with a draft, ...)
    steps: str    # which steps use it


@dataclass(frozen=True)
class LoadRate:
    seconds: float | None       # one load of this target, when known
    bytes_per_s: float | None   # the read rate it implies (or was given)
    source: str


def load_rate(weight_bytes: int, *, given_seconds: float | None = None, given_gb_per_s: float | None = None,
              measured_seconds: list[float] | None = None) -> LoadRate:
    if given_seconds:
        return LoadRate(given_seconds, weight_bytes / given_seconds if weight_bytes else None,
                        "run config: plan.load_seconds")
    if given_gb_per_s:
        return LoadRate(round(weight_bytes / (given_gb_per_s * GB), 1), given_gb_per_s * GB,
                        "run config: plan.load_gb_per_s")
    if measured_seconds:
        seconds = sorted(measured_seconds)[len(measured_seconds) // 2]
        return LoadRate(round(seconds, 1), weight_bytes / seconds if weight_bytes and seconds else None,
                        f"measured: the median of this run's {len(measured_seconds)} loads on this host")
    return LoadRate(None, None, "unknown: no load of this run recorded on this host; set plan.load_seconds "
                                "(or plan.load_gb_per_s)")


def plan_loads(loads: list[Load], rate: LoadRate, weight_bytes: int,
               live: dict[str, Any] | None = None) -> dict[str, Any]:
    """`plan --json`'s "loads": each load with its estimated seconds, the count and the total. `live`: the
    server on the run's port now ({"job", "run", "fits", "kept"}): one that fits serves the first load (no
    seconds, not counted); another run's kept server that does not is stopped before it."""
    listed = [{"serves": load.serves, "steps": load.steps, "seconds": rate.seconds} for load in loads]
    if listed and live is not None:
        server = f"vLLM server job {live['job']} of run {live['run']}"
        if live["fits"]:
            listed[0].update(seconds=0.0, uses=server)
        elif live["kept"]:
            listed[0]["replaces"] = f"{server} (kept for the next run)"
    made = [load for load in listed if "uses" not in load]
    return {"count": len(made), "reused": len(listed) - len(made), "weight_bytes": weight_bytes,
            "read_gb_per_s": round(rate.bytes_per_s / GB, 3) if rate.bytes_per_s else None,
            "seconds_each": rate.seconds, "source": rate.source, "loads": listed,
            "total_seconds": round(rate.seconds * len(made), 1) if rate.seconds is not None else None}
