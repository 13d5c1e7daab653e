"""Task: `sync` — push src/, patches/, runs/*.yaml to a host (rsync, or SFTP without it)."""

from __future__ import annotations

import time

from invoke import task

from remote.session import emit_json, host_session, reports_errors


@task(help={"host": "inventory host", "dry_run": "show what would change, change nothing",
            "json": "one JSON document on stdout", "sftp": "use SFTP even if the host has rsync"})
@reports_errors
def sync(c, host=None, dry_run=False, json=False, sftp=False):
    """Push what the host needs (src/, patches/, runs/) to its workdir; only changed files move."""
    from remote import render
    from remote.ssh import kind_of
    from remote.sync import RsyncUnavailable, rsync_sync, sftp_sync

    started = time.perf_counter()
    with host_session(host) as session:
        chosen = session.host
        can_sftp = kind_of(chosen).sftp
        report = None
        if not (sftp and can_sftp):
            # rsync first: one login. Only a host without rsync costs a second connection, for SFTP.
            try:
                report = rsync_sync(chosen, dry_run=dry_run, inventory=session.inventory)
            except RsyncUnavailable:
                if not can_sftp:
                    raise
        if report is None:
            report = sftp_sync(session.conn, chosen, dry_run=dry_run)
    document = {**report.to_dict(), "host": chosen.name, "elapsed_s": round(time.perf_counter() - started, 3)}
    if json:
        emit_json(document)
        return
    out = render.console()
    verb = "would change" if dry_run else "changed"
    for name in report.changed:
        out.print(f"  [cyan]{verb}[/] {name}")
    for name in report.deleted:
        out.print(f"  [red]{'would delete' if dry_run else 'deleted'}[/] {name}")
    revision = report.revision
    dirty = " (dirty)" if revision.get("dirty") else ""
    out.print(f"{chosen.name}: {len(report.changed)} file(s) {verb}, {len(report.deleted)} deleted via "
              f"{report.method}; revision {str(revision.get('commit'))[:10]}{dirty} in {document['elapsed_s']} s")


TASKS = [sync]
