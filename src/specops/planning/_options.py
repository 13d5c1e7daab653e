"""`make_plan`, and the options a plan weighs beside the run's own choice: every hidden-state backend x mode
(one row each) and, where the run's choice does not fit the host, the nearest that do (the most rows that fit,
fp8, N more hosts of the inventory's kind), each sized by the same arithmetic as the run's own (_plan.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specops.planning import _sizes as sizes
from specops.planning._plan import (
    DISK_SHARE,
    MODES,
    HostFacts,
    Plan,
    Rate,
    Rates,
    RunFacts,
    _draft,
    _hidden_states,
    _modes,
    _recommend,
    _server,
    _server_figures,
    _server_sizes,
    _times,
    human,
)
from specops.planning._target import TargetFacts

# a backend's own limits: mooncake keeps the states in a store between server and trainer, never in files
_BACKEND_MODES = {"file": MODES, "fp8": MODES, "mooncake": ("online",)}


def _row(backend: str, mode: str, figures: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"backend": backend, "mode": mode, "fits": figures["fits"], "disk_bytes": figures["disk_bytes"],
            "hidden_state_bytes_on_disk": figures["hidden_state_bytes_on_disk"],
            "on_disk_share": figures["on_disk_share"], "server_loads": 1, "extract_s": figures["extract_s"],
            "train_s": figures["train_s"], "total_s": figures["total_s"],
            "placement": figures["placement"]["kind"], "problems": figures["problems"], **extra}


def backend_rows(target: TargetFacts, run: RunFacts, host: HostFacts, rates: Rates,
          trainer: dict[str, Any]) -> list[dict[str, Any]]:
    """Every backend x mode: one server load each (the extraction server, kept up through training online)."""
    rows = []
    for backend in sizes.BACKENDS:
        states = _hidden_states(target, run, backend)
        modes = _modes(target, run, host, rates, states, trainer)
        for mode in MODES:
            figures = modes[mode]
            if mode not in _BACKEND_MODES[backend]:
                rows.append({**_row(backend, mode, figures), "fits": False,
                             "problems": [f"{backend} keeps no files: {mode} extracts to disk"]})
                continue
            extra = {"bytes_per_token": states["file_bytes_per_token"]}
            if backend == "mooncake":
                extra["needs"] = "mooncake-transfer-engine (a master job and its store) on server and trainer hosts"
            rows.append(_row(backend, mode, figures, **extra))
    return rows


def _most_rows(target: TargetFacts, run: RunFacts, host: HostFacts, backend: str,
               trainer: dict[str, Any]) -> int:
    """The most rows (of the run's average length) whose files, prepared rows and checkpoints fit the usable disk."""
    states = _hidden_states(target, run, backend)
    per_row_tokens = run.tokens / max(run.samples, 1)
    per_row = (per_row_tokens * (states["file_bytes_per_token"] + sizes.PREPARED_BYTES_PER_TOKEN)
               + sizes.FILE_HEADER_BYTES)
    room = int(DISK_SHARE * host.disk_free_bytes) - run.epochs * trainer["checkpoint_bytes"]
    return max(int(room // per_row), 0) if per_row else 0


def alternatives(target: TargetFacts, run: RunFacts, host: HostFacts, rates: Rates, trainer: dict[str, Any],
                  rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The nearest changes that fit, each with its disk, loads and time: fewer rows, fp8, more hosts."""
    found: list[dict[str, Any]] = []
    backend = run.hidden_state_backend if run.hidden_state_backend != "mooncake" else "file"
    for chosen in dict.fromkeys((backend, "fp8")):
        most = min(_most_rows(target, run, host, chosen, trainer), run.samples)
        if 0 < most < run.samples:
            smaller = replace(run, samples=most, tokens=int(run.tokens * most / run.samples),
                              loss_tokens=_share(run.loss_tokens, most, run.samples), mode="offline",
                              hidden_state_backend=chosen)
            figures = _modes(target, smaller, host, rates, _hidden_states(target, smaller), trainer)["offline"]
            if figures["fits"]:
                found.append(_row(chosen, "offline", figures, change=f"the most rows that fit: {most} of "
                                  f"{run.samples} ({most / run.samples:.0%})", samples=most))
    fitting = [row for row in rows if row["fits"] and row["backend"] == "fp8"]
    order = {mode: index for index, mode in enumerate(("offline", "hybrid", "online"))}
    if fitting and run.hidden_state_backend != "fp8":
        best = min(fitting, key=lambda row: order[row["mode"]])
        found.append({**best, "change": f"hidden_states.backend fp8 (mode {best['mode']}): the states at "
                      f"{best['bytes_per_token']} B a token instead of "
                      f"{_hidden_states(target, run)['file_bytes_per_token']}"})
    found += _more_hosts(target, run, host, rates, trainer)
    return found


def _more_hosts(target: TargetFacts, run: RunFacts, host: HostFacts, rates: Rates,
                trainer: dict[str, Any]) -> list[dict[str, Any]]:
    """More hosts of this host's kind: serve hosts that each keep their share of the files (offline), or one
    train host beside this serve host (online: the server keeps every GPU here; the states travel by mooncake,
    or by a folder both hosts share with file/fp8)."""
    import math

    found = []
    for backend in ("file", "fp8"):
        states = _hidden_states(target, run, backend)
        usable = int(DISK_SHARE * host.disk_free_bytes)
        other = run.tokens * sizes.PREPARED_BYTES_PER_TOKEN + run.epochs * trainer["checkpoint_bytes"]
        room = usable - other
        if room <= 0 or not states["file_bytes_total"]:
            continue
        hosts = math.ceil(states["file_bytes_total"] / room)
        if hosts > 1:
            share = replace_share(run, hosts)
            figures = _modes(target, share, host, rates, _hidden_states(target, share, backend), trainer)["offline"]
            times = _times(run, Rates(Rate((rates.extract.tokens_per_s or 0) * hosts or None, rates.extract.source),
                                      rates.train, rates.serve), 1.0)
            each = human(states["file_bytes_total"] / hosts)
            found.append({**_row(backend, "offline", figures, change=f"{hosts - 1} more host(s) of this kind: each "
                                 f"extracts and keeps 1/{hosts} of the rows ({each} of hidden states a host); the "
                                 "trainer reads them across hosts", hosts=hosts),
                          **times, "server_loads": hosts})
    online = _modes(target, run, host, rates, _hidden_states(target, run, "mooncake"), trainer)["online"]
    if host.gpus and not online["fits"]:
        trainer_fits = trainer["total_bytes"] <= (host.gpu_memory_bytes or 0)
        server = _server(target, run, host, _server_sizes(target, run, host).tensor, run.gpu_memory_utilization)
        disk_ok = online["disk_bytes"] - online["hidden_state_bytes_on_disk"] <= int(DISK_SHARE * host.disk_free_bytes)
        if trainer_fits and not server["problems"] and disk_ok:
            found.append({**_row("mooncake", "online", {**online, "fits": True, "problems": []},
                                 change="1 more host (train role): the server keeps all of this host's GPUs, the "
                                        "trainer runs on the other (the run's hosts: {serve: [this], train: "
                                        "[other]}); states travel by mooncake, or by a folder both hosts share "
                                        "(hidden_states.shared_dir) with file or fp8", hosts=2),
                          "placement": "split across hosts"})
    return found


def replace_share(run: RunFacts, hosts: int) -> RunFacts:
    """One host's share of the run when `hosts` split its rows."""
    return replace(run, samples=max(run.samples // hosts, 1), tokens=run.tokens // hosts,
                   loss_tokens=_share(run.loss_tokens, 1, hosts))


def _share(count: int | None, part: int, whole: int) -> int | None:
    """count x part / whole (the loss tokens of fewer rows), None kept."""
    return None if count is None else int(count * part / whole)


def make_plan(target: TargetFacts, run: RunFacts, host: HostFacts, rates: Rates | None = None) -> Plan:
    rates = rates or Rates()
    on_gpu = host.gpus > 0
    states = _hidden_states(target, run)
    trainer = _draft(target, run, on_gpu)
    trainer.pop("_draft")
    plan = Plan(run=run, host=host, target=target, rates=rates)
    plan.modes = _modes(target, run, host, rates, states, trainer)
    prepared = run.tokens * sizes.PREPARED_BYTES_PER_TOKEN
    checkpoints = run.epochs * trainer["checkpoint_bytes"]
    plan.figures = {"hidden_states": states, "trainer": trainer,
                    "disk": {"prepared_bytes": prepared, "checkpoints_bytes": checkpoints,
                             "free_bytes": host.disk_free_bytes,
                             "usable_bytes": int(DISK_SHARE * host.disk_free_bytes)},
                    "server": _server_figures(target, run, host)}
    plan.recommended = _recommend(plan)
    plan.rows = backend_rows(target, run, host, rates, trainer)
    if not plan.modes[run.mode]["fits"]:
        plan.alternatives = alternatives(target, run, host, rates, trainer, plan.rows)
    if plan.recommended.get("mode") is None:
        alone = [alt for alt in plan.alternatives if not alt.get("hosts")]
        if alone:  # on this host alone: the alternative that keeps the most rows
            best = max(alone, key=lambda alt: (alt.get("samples") or run.samples, alt["backend"] == "fp8"))
            plan.recommended["nearest"] = {key: best[key] for key in ("backend", "mode", "change", "disk_bytes",
                                                                      "total_s", "server_loads")}
            plan.recommended["nearest"]["samples"] = best.get("samples", run.samples)
    return plan
