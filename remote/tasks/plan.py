"""Task: `plan` — what a run costs on a host before any model load, and the hidden-state mode that fits.

The host computes it (`python -m specops plan`): it reads its own GPUs and free disk, the target's
config.json and safetensors headers, and the run's data; this side only renders the document.
"""

from __future__ import annotations

import sys
from typing import Any

from invoke import task

from remote.errors import BadInput
from remote.session import emit_json, reports_errors
from remote.tasks.shared import local_config_name
from specops.contract import commandline
from specops.contract.values import whole_flag

PLAN_TIMEOUT_S = 600  # estimating tokens loads the tokenizer: seconds, a minute on a busy host


def plan_call(run: str | None, samples: int | None, roles: dict[str, str] | None = None):
    """The exchange of one host: (exit code, the plan document); `roles`: each host's part of a role split."""

    def exchange(host, conn) -> tuple[int, dict[str, Any]]:
        from remote.agent import agent_call
        from remote.errors import BadInput
        from specops.contract import commandline

        run_name = run or host.run
        role = (roles or {}).get(host.name)
        # planned with the serve env the run's jobs will have: its vLLM's loads, the live servers that fit it
        argv = commandline.plan(run=run_name, samples=samples, role=role, serve_python=host.envs.get("serve"))
        result = agent_call(conn, host, argv, timeout=PLAN_TIMEOUT_S)
        if result.exit_code == 2:
            raise BadInput(local_config_name(str(result.document.get("error")), run_name))
        return result.exit_code, result.document

    return exchange


def size(count: Any) -> str:
    if not isinstance(count, int | float):
        return "-"
    for unit, step in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if abs(count) >= step:
            return f"{count / step:.2f} {unit}"
    return f"{int(count)} B"


def number(count: Any) -> str:
    for unit, step in ((" T", 10**12), (" B", 10**9), (" M", 10**6), (" k", 10**3)):
        if count >= step:
            return f"{count / step:.2f}{unit}"
    return str(count)


def gib(count: Any) -> str:
    return f"{count / 2**30:.1f} GiB" if isinstance(count, int | float) else "-"


def duration(seconds: Any) -> str:
    if not isinstance(seconds, int | float):
        return "unknown"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours} h {rest // 60:02d} min" if hours else f"{rest // 60} min {rest % 60:02d} s"


def summary(document: dict[str, Any]) -> str:
    """One line of a host's plan (the several-hosts table)."""
    if "modes" not in document:
        return str(document.get("error", "plan failed"))
    if "role" in document:  # a role split: this host's part
        role = document["role"]
        verdict = "fits" if role["fits"] else f"does NOT fit: {role['problems'][0]}"
        return f"{role['role']}: {role['holds']}: {verdict}"
    mode = document["modes"][document["mode"]]
    verdict = "fits" if document["ok"] else f"does NOT fit: {document['problems'][0]}"
    free = document["host_facts"]["disk_free_bytes"]
    return (f"{document['mode']} {verdict}; disk {size(mode['disk_bytes'])} of {size(free)} free; "
            f"recommends {recommends(document)}")


def recommends(document: dict[str, Any]) -> str:
    """The recommended mode, or the nearest backend, mode and rows that fit when none does as written."""
    recommended = document["recommended"]
    nearest = recommended.get("nearest")
    if recommended.get("mode") is not None or not nearest:
        return str(recommended.get("mode"))
    return f"none as written (nearest: {nearest['backend']} {nearest['mode']}, {_rows_of(nearest, document)} rows)"


def loads_title(loads: dict[str, Any]) -> str:
    """The loads table's title: the loads the run makes, those a live server saves, their time in all."""
    saved = f" ({loads['reused']} more served by a live server)" if loads.get("reused") else ""
    return f"model loads: {loads['count']}{saved}, {duration(loads['total_seconds'])} in all"


def load_time(load: dict[str, Any]) -> str:
    """One load's time: none when a live server serves it; a kept server it stops first is named."""
    if load.get("uses"):
        return f"none: {load['uses']} serves it"
    return duration(load["seconds"]) + (f"; first stops {load['replaces']}" if load.get("replaces") else "")


def _where(placement: dict[str, Any]) -> str:
    return placement["kind"] + (f" ({placement['server_gpus']}+{placement['trainer_gpus']} GPUs)"
                                if placement["kind"] == "split" else "")


def modes_table(document: dict[str, Any]):
    from remote import render as out

    modes = out.table("hidden-state modes", ["mode", "fits", "disk", "hidden states on disk", "placement", "time",
                                            "why not"])
    for name, mode in document["modes"].items():
        label = f"{name} (the run's)" if name == document["mode"] else name
        modes.add_row(label, out.status_text(mode["fits"], "yes" if mode["fits"] else "no"), size(mode["disk_bytes"]),
                      size(mode["hidden_state_bytes_on_disk"]), _where(mode["placement"]), duration(mode["total_s"]),
                      "; ".join(mode["problems"]))
    return modes


def rows_table(document: dict[str, Any]):
    """Every hidden-state backend x mode: its disk, server loads, time, placement, and why it does not fit."""
    from remote import render as out

    table = out.table("hidden-state backends x modes", ["backend", "mode", "fits", "disk", "hidden states on disk",
                                                        "B a token", "server loads", "placement", "time", "why not"])
    ours = (document.get("backend", "file"), document["mode"])
    for row in document["rows"]:
        placement = document["modes"][row["mode"]]["placement"] if (row["backend"], row["mode"]) == ours else None
        label = row["mode"] + (" (the run's)" if (row["backend"], row["mode"]) == ours else "")
        table.add_row(row["backend"], label, out.status_text(row["fits"], "yes" if row["fits"] else "no"),
                      size(row["disk_bytes"]), size(row["hidden_state_bytes_on_disk"]),
                      f"{row['bytes_per_token']:,}" if row.get("bytes_per_token") else "-",
                      str(row.get("server_loads", "-")), _where(placement) if placement else row["placement"],
                      duration(row["total_s"]), "; ".join(row["problems"]) or row.get("needs", ""))
    return table


def _rows_of(alternative: dict[str, Any], document: dict[str, Any]) -> str:
    samples = alternative.get("samples") or document["data"]["samples"]
    return f"{samples:,} of {document['data']['samples']:,}"


def alternatives_table(document: dict[str, Any]):
    """The nearest changes that fit when the run's own choice does not: each with its disk, loads and time."""
    from remote import render as out

    table = out.table(f"what fits instead of {document.get('backend', 'file')} {document['mode']}",
                      ["backend", "mode", "rows", "hosts", "disk a host", "server loads", "time", "change"])
    for alternative in document["alternatives"]:
        table.add_row(alternative["backend"], alternative["mode"], _rows_of(alternative, document),
                      str(alternative.get("hosts", 1)), size(alternative["disk_bytes"]),
                      str(alternative.get("server_loads", "-")), duration(alternative["total_s"]),
                      alternative.get("change", ""))
    return table


def recommended_line(document: dict[str, Any]) -> str:
    """The plan's choice in one line: the recommended mode, or, when none fits as the run is written, the
    nearest that does on this host alone with its disk, loads and time."""
    recommended = document["recommended"]
    nearest = recommended.get("nearest")
    if recommended.get("mode") is not None or not nearest:
        return f"recommended: [bold]{recommended.get('mode')}[/] — {recommended.get('reason')}"
    loads = nearest.get("server_loads")
    return (f"recommended: [bold]none as written; nearest {nearest['backend']} {nearest['mode']} with "
            f"{_rows_of(nearest, document)} rows[/] — disk {size(nearest['disk_bytes'])}, {loads} server "
            f"load{'s' if loads != 1 else ''}, time {duration(nearest['total_s'])} ({nearest['change']}); "
            f"as written: {recommended.get('reason')}")


def render(document: dict[str, Any]) -> None:
    from remote import render as out

    console = out.console()
    target, states, data = document["target"], document["hidden_states"], document["data"]
    trainer, server, host = document["trainer"], document["server"], document["host_facts"]
    facts = out.table(f"plan — run {document['run']} on {document.get('host', '?')}", ["what", "figure", "how"])
    facts.add_row("host", f"{host['gpus']} GPU(s) x {gib(host['gpu_memory_bytes'])}, {size(host['disk_free_bytes'])} "
                  "free", host["source"])
    facts.add_row("target", f"{number(target['params'])} params, {size(target['weight_bytes'])} of weights",
                  f"{target['layout']}, {target['layers']} layers x {target['hidden']}; {target['weight_source']}")
    memory = target.get("memory_bytes")
    if memory:  # stored as published (int4, fp8) is not what a load holds: transformers decompresses, vLLM keeps it
        facts.add_row("weights loaded", f"{size(memory['transformers'])} under transformers, {size(memory['vllm'])} "
                      "under vLLM", f"stored {size(target['weight_bytes'])}"
                      + (f" as {target['quantization']}" if target.get("quantization") else "")
                      + f"; transformers computes in {target.get('compute_dtype')}")
    facts.add_row("KV cache", f"{server['kv_bytes_per_token']:,} B a token", server["kv_layout"])
    facts.add_row("data", f"{data['tokens']:,} tokens in {data['samples']:,} rows", data["tokens_source"])
    if data.get("loss_tokens") is not None:  # the answers' tokens: what the draft learns from
        facts.add_row("loss tokens", f"{data['loss_tokens']:,} ({data['loss_tokens'] / max(data['samples'], 1):,.0f} "
                      "a row): what the draft learns from", data.get("loss_tokens_source") or "")
    facts.add_row("hidden states", f"{states['bytes_per_token']:,} B a token, {size(states['bytes_total'])}",
                  f"{states['layers']} layers x {states['hidden']} x {states['dtype']}")
    facts.add_row("server", f"tensor {server['tensor_parallel']} x data {server['data_parallel']}",
                  (f"{gib(server.get('weights_per_gpu_bytes'))} of weights a GPU, KV for "
                   f"{server.get('kv_tokens', 0):,} tokens") if "kv_tokens" in server else "no GPU")
    facts.add_row("trainer", f"{size(trainer['total_bytes'])} a rank",
                  f"draft {number(trainer['draft_params'])} params ({number(trainer['trainable_params'])} "
                  f"trained), {trainer['optimizer']} state {size(trainer['optimizer_bytes'])}, activations "
                  f"{size(trainer['activation_bytes'])} at {trainer['tokens_per_step']} tokens a step")
    console.print(facts)
    if document.get("rows"):
        console.print(rows_table(document))
    else:  # an agent from before the backend rows: its modes alone
        console.print(modes_table(document))
    if document.get("alternatives"):
        console.print(alternatives_table(document))
    loads = document.get("loads")
    if loads and loads["loads"]:
        table = out.table(loads_title(loads), ["serves", "for", "time"])
        for load in loads["loads"]:
            table.add_row(load["serves"], load["steps"], load_time(load))
        console.print(table)
        console.print(f"a load: {duration(loads['seconds_each'])} ({loads['source']})")
    rates = document["rates"]
    console.print("rates: " + "; ".join(f"{name} {rate['tokens_per_s'] or '?'} tokens/s ({rate['source']})"
                                       for name, rate in rates.items()))
    console.print(recommended_line(document), soft_wrap=True)  # one line, however long
    from rich.markup import escape

    for line in document.get("advice") or []:  # settings known to waste the training (an agent without it: none)
        console.print(f"[yellow]advice[/]: {escape(line)}", soft_wrap=True, highlight=False)
    verdict = "fits" if document["ok"] else f"does NOT fit: {document['problems'][0]}"
    console.print(out.status_text(document["ok"], f"the run's mode {document['mode']} {verdict}"))


@task(help={"run": "run config runs/NAME.yaml (default: the host's run)",
            "host": "inventory host (default: the inventory's default)",
            "hosts": "several inventory hosts, comma-separated: each plans on its own GPUs and disk, one row each; "
                     "by role, serve=a,b;train=c: each host plans its part of the role split",
            "all_": "every inventory host, one row each", **commandline.PLAN.helps("samples"),
            "json": "one JSON document on stdout (keys in the README)"})
@reports_errors
def plan(c, run=None, host=None, hosts=None, all_=False, samples=None, json=False):
    """What a run costs on a host before any model load: hidden-state bytes, disk per mode, GPU memory
    of the server and the trainer, parallel sizes, time, and the mode that fits. Exit 1: the run's
    mode does not fit (a launch would be refused)."""
    from remote.inventory import load_inventory
    from remote.pipeline_nodes import roles_in
    from remote.several_hosts import chosen_hosts, run_across
    from remote.tasks.shared import exchange_once

    rows = whole_flag(samples, "--samples")
    inventory = load_inventory()
    roles = roles_in(hosts, "--hosts") if hosts else None
    if roles:  # a role split: each host plans its own part (the serve hosts first, as the pipeline ranks them)
        hosts = ",".join([*roles["serve"], *roles["train"]])
    several = chosen_hosts(inventory, host, hosts, all_)
    if several is not None:
        parts = {name: role for role, names in (roles or {}).items() for name in names}
        run_across(f"plan — run {run or 'each host’s run'}", several, inventory, plan_call(run, rows, parts or None),
                   summary, json=json)
        return
    _chosen, code, document = exchange_once(inventory, host, plan_call(run, rows), quick=True)
    if json:
        emit_json(document)
    elif "modes" in document:
        render(document)
        if document.get("target_note"):  # an embedded target planned from its config: nothing generated yet
            print(f"specops: {document['target_note']}", file=sys.stderr)
    elif code == 2:  # bad input: one line on stderr, exit 2
        raise BadInput(str(document.get("error")))
    else:
        print(f"specops: {document.get('error', 'plan failed')}", file=sys.stderr)
    if code != 0:
        raise SystemExit(code)


TASKS = [plan]
