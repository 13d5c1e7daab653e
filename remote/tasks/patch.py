"""Task: `patch apply|verify|status|revert|new` — declarative patches to a host's installed packages.

One agent call (one SSH round trip) per action. `invoke patch verify --host gpu1` works as
written: the action is a positional word.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from invoke import task

from remote.errors import BadInput, ConnectError
from remote.session import emit_json, host_connection, reports_errors
from specops.contract import commandline

ACTIONS = ("apply", "verify", "status", "revert", "new")
MANY_HOST_ACTIONS = ("verify", "status")  # the read-only ones; a change is made one host at a time
EVERY_ENV_ACTIONS = ("apply", "verify", "status")  # without --env: each env of the host (default, serve, ...)


def _let_the_action_be_missing() -> None:
    """`invoke patch` alone: Invoke's parser refuses a missing positional with its own message and
    exit 1; the house answers bad input with one line and exit 2. So the parser hands the task an
    empty action instead, and the task says which actions there are."""
    from invoke.parser.parser import ParseMachine as Parser

    original = Parser.complete_context
    if getattr(original, "lets_patch_action_be_missing", False):
        return

    def complete_context(self: Parser) -> None:
        if self.context is not None and self.context.name == "patch":
            for argument in self.context.missing_positional_args:
                argument.value = ""
        original(self)

    complete_context.lets_patch_action_be_missing = True  # type: ignore[attr-defined]
    Parser.complete_context = complete_context  # type: ignore[method-assign]


_let_the_action_be_missing()


@task(
    positional=["action"],
    iterable=["set_"],
    help={**commandline.PATCH.helps("action", "dry_run", "deep", "module", "reason", "from_finding", set_="sets",
                                    id_="patch_id"),
          "host": "inventory host", "json": "one JSON document on stdout",
          "env": "which of the host's envs (inventory envs: serve, ...); default: apply/verify/status cover "
                 "every env of the host, one row per env and set; revert/new the default env",
          "edited": "new: local edited copy of that file",
          "verbose": "verify: also list what the static checks could not resolve (--json always has it)",
          "hosts": "verify/status: several inventory hosts, comma-separated, in parallel, one row each",
          "all_": "verify/status: every inventory host, in parallel, one row each"},
)
@reports_errors
def patch(c, action=None, host=None, set_=None, json=False, dry_run=False, deep=False, env=None, module=None,
          edited=None, id_=None, reason=None, from_finding=None, verbose=False, hosts=None, all_=False):
    """Apply, verify, show or revert the patch sets for a host's installed packages."""
    from remote import journal
    from remote.inventory import load_inventory
    from remote.names import safe_name
    from remote.several_hosts import chosen_hosts, run_across

    if not action:
        raise BadInput(f"patch: which action? one of: {', '.join(ACTIONS)} (e.g. invoke patch verify)")
    if action not in ACTIONS:
        raise BadInput(f"patch: unknown action {action!r} (one of: {', '.join(ACTIONS)})")
    options = {"action": action, "sets": list(set_ or []), "dry_run": dry_run, "deep": deep}
    args = commandline.patch(**options)  # checked before connecting (a set's name is a folder under patches/)
    if action == "new" and from_finding:
        if not (set_ and len(set_) == 1) or module or edited:
            raise BadInput("patch new --from-finding: needs one --set (and no --module/--edited)")
    elif action == "new":
        if not (module and edited and id_ and reason and set_ and len(set_) == 1):
            raise BadInput("patch new: needs --module, --edited, --id, --reason and one --set")
        safe_name(id_, "--id")  # the id names the patch file, here and on the host
        edited_path = Path(edited)
        if not edited_path.is_file():
            raise BadInput(f"patch new: --edited: no such file {edited}")
    inventory = load_inventory()
    several = chosen_hosts(inventory, host, hosts, all_)
    if several is not None:
        if action not in MANY_HOST_ACTIONS:
            raise BadInput(f"patch {action}: one host at a time (--host); --hosts/--all read only "
                           f"({' and '.join(MANY_HOST_ACTIONS)})")

        def exchange(chosen, conn):
            return _every_env(conn, chosen, args, _roles(chosen, env, action))

        run_across(f"patch {action}", several, inventory, exchange, sets_summary, json=json)
        return
    started = time.perf_counter()
    # verify and status only read: they may ride a shared OpenSSH master (remote.ssh.master)
    with host_connection(host, quick=action in MANY_HOST_ACTIONS) as (chosen, conn):
        if action == "new" and from_finding:
            args = commandline.patch(**options, from_finding=from_finding, patch_id=id_, reason=reason)
        elif action == "new":
            # The edited copy travels to the host, where the installed file it is compared with lives.
            remote_copy = f"{chosen.workdir.rstrip('/')}/tmp/patch-new-{id_}.py"
            try:
                conn.upload(Path(edited).read_bytes(), remote_copy)
            except ConnectError as exc:
                raise BadInput(f"patch new: could not upload {edited}: {exc}") from None
            args = commandline.patch(**options, module=module, patch_id=id_, reason=reason, edited=remote_copy)
        code, merged = _every_env(conn, chosen, args, _roles(chosen, env, action))
        trips = conn.round_trips
    document = {**_checkout_names(merged, chosen.workdir), "host": chosen.name, "round_trips": trips,
                "elapsed_s": round(time.perf_counter() - started, 3)}
    if action == "new" and code == 0:
        _write_new_patch(document)
    if action in ("apply", "revert") and not dry_run:
        journal.record(f"patch-{action}", host=chosen.name, ok=document.get("ok"),
                       sets=[entry.get("name") for entry in document.get("sets", [])])
    if json:
        emit_json(document)
    else:
        _render(action, document, verbose=verbose)
    if code != 0:
        raise SystemExit(code)


def _roles(host, env: str | None, action: str) -> list[str | None]:
    """The envs an action covers: --env alone; else, for apply/verify/status, the default env (None) and each
    inventory role with an interpreter of its own."""
    if env or action not in EVERY_ENV_ACTIONS:
        return [env]
    return [None, *sorted(role for role, python in host.envs.items() if python != host.python)]


def _every_env(conn, host, args: list[str], roles: list[str | None]) -> tuple[int, dict]:
    """One agent call per env (each run by that env's interpreter, which decides what fits there), merged into
    one document: every set and check tagged with its "env", "envs" listing each env's own document. The exit
    code is the worst of them."""
    from remote.agent import agent_call

    if len(roles) == 1 and roles[0] is None:
        result = agent_call(conn, host, args, timeout=300)
        return result.exit_code, result.document
    merged: dict = {"ok": True, "sets": [], "checks": [], "lines": [], "envs": []}
    code = 0
    for role in roles:
        name = role or "default"
        result = agent_call(conn, host, args, env_role=role, timeout=300)
        document = result.document
        code = max(code, result.exit_code)
        merged["ok"] = merged["ok"] and bool(document.get("ok")) and result.ok
        merged["envs"].append({"env": name, "python": host.env_python(role), "ok": document.get("ok"),
                               "exit_code": result.exit_code, **({"error": document["error"]} if "error" in document
                                                                 else {})})
        for key in ("action", "patches_dir", "dry_run", "analysis"):
            merged.setdefault(key, document.get(key))
        merged["sets"] += [{**entry, "env": name} for entry in document.get("sets", [])]
        merged["checks"] += [{**check, "env": name} for check in document.get("checks", [])]
        merged["lines"] += [f"{name}: {line}" for line in document.get("lines", [])]
        if "error" in document and "sets" not in document:
            merged["lines"].append(f"{name}: {document['error']}")
            merged["sets"].append({"name": "-", "env": name, "ok": False, "result": "error",
                                   "detail": document["error"], "patches": []})
    return code, merged


def _checkout_names(document: dict, host_workdir: str) -> dict:
    """The host reads its copy of the patch sets (<workdir>/patches/); a person edits this checkout's:
    every message names the file here."""
    import json as json_module

    from remote.bundle import patches_dir

    host_copy = f"{host_workdir.rstrip('/')}/patches/"
    here = f"{patches_dir()}/"
    text = json_module.dumps(document)
    return json_module.loads(text.replace(json_module.dumps(host_copy)[1:-1], json_module.dumps(here)[1:-1]))


def sets_summary(doc: dict) -> str:
    """One line of a host's patch verify/status: each set's result, then the failed checks."""
    if "sets" not in doc:
        return str(doc.get("error", "patch failed"))
    parts = [f"{_env_prefix(entry)}{entry.get('name')}: {entry.get('result') or entry.get('state') or '-'}"
             for entry in doc["sets"]]
    failed = [f"{check.get('patch')} {check.get('check')}" for check in doc.get("checks", []) if not check.get("ok")]
    if failed:
        parts.append(f"failed: {', '.join(failed[:4])}{' ...' if len(failed) > 4 else ''}")
    return "; ".join(parts) or "no patch sets"


def _write_new_patch(document: dict) -> None:
    """The agent composes the patch file against the host's installed file; it lands in this checkout."""
    from remote.inventory import REPO_ROOT
    from remote.names import inside

    relative = document.get("patch_file_relative")
    text = document.get("patch_text")
    if not relative or text is None:
        return
    target = inside(Path(os.environ.get("SPECOPS_PATCHES_DIR") or REPO_ROOT / "patches"), relative,
                    what="new patch file")  # named by the host
    if target.exists():
        raise BadInput(f"{target}: already exists; choose another --id")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    document["written_here"] = str(target)


def _unresolved(check: dict, verbose: bool) -> str:
    """With --verbose, one line per finding a static check could not resolve (file:line: call: why)."""
    if not verbose:
        return ""
    return "".join(f"\n  {finding.get('file')}:{finding.get('line')}: "
                   f"{' '.join(str(finding.get('code') or finding.get('callee') or '').split())[:70]}: "
                   f"{finding.get('detail')}"
                   for finding in check.get("findings") or [] if finding.get("status") == "unknown")


def _env_prefix(entry: dict) -> str:
    return f"{entry['env']}: " if entry.get("env") else ""


def _render(action: str, doc: dict, *, verbose: bool = False) -> None:
    from remote import render

    out = render.console()
    if "error" in doc and "sets" not in doc:
        out.print(render.status_text(False, doc["error"]))
        return
    if action == "verify":
        view = render.table(f"patch verify — {doc['host']}", ["env", "patch", "check", "result", "detail"])
        for check in doc.get("checks", []):
            view.add_row(check.get("env", "default"), check.get("patch", ""), check.get("check", ""),
                         render.status_text(check.get("ok"), "ok" if check.get("ok") else "FAIL"),
                         str(check.get("detail", "")) + _unresolved(check, verbose))
        out.print(view)
        for entry in doc.get("sets", []):
            if entry.get("result") == "not applicable":
                out.print(f"[dim]{_env_prefix(entry)}{entry['name']}: {entry.get('detail')}[/]")
    elif action == "status":
        for line in doc.get("lines", []):
            out.print(line)
    elif action == "new" and doc.get("proposed_diff") and not doc.get("ok"):
        out.print(doc["proposed_diff"], markup=False, highlight=False)
        out.print(render.status_text(False, doc.get("error", "the proposed patch does not bind")))
    elif action == "new":
        if doc.get("proposed_diff"):
            out.print(doc["proposed_diff"], markup=False, highlight=False)
        out.print(f"wrote {doc.get('written_here')} ({doc.get('replacements')} replacement(s), replayed against "
                  f"the host's {doc.get('file')}); review it and commit it with its set")
    else:
        for entry in doc.get("sets", []):
            out.print(f"[bold]{_env_prefix(entry)}{entry['name']}[/]: "
                      f"{render.status_text(entry.get('ok'), entry.get('result') or '')}"
                      f" — {entry.get('detail', '')}")
            for patch_entry in entry.get("patches", []):
                out.print(f"  {patch_entry['id']}: {patch_entry.get('result') or patch_entry.get('state')}"
                          f"  [dim]{patch_entry.get('file') or ''}[/]")
            if action == "apply" and doc.get("dry_run") and entry.get("diff"):
                out.print(entry["diff"], markup=False, highlight=False)
    out.print(f"{render.status_text(doc.get('ok'), 'OK' if doc.get('ok') else 'FAILED')} in {doc['elapsed_s']} s, "
              f"{doc['round_trips']} round trip(s)")


TASKS = [patch]
