"""A training over several hosts as one group: one torchrun node job per host, started together,
watched together, stopped together.

Each host runs `python -m specops step train --nnodes N --node-rank I --rdzv-endpoint HOST0:PORT
--rdzv-id ID` as its own job under tmux (speculators' trainer under torchrun's c10d rendezvous; no
scheduler of ours). The control side keeps one connection per host and asks every host for its
job's state each poll, in parallel. The first host whose job ended other than succeeded, or that
does not answer within its channel timeout (dead or cut off), ends the group: every other host's
job is stopped at once and the report names that host and why. torchrun alone would not do this:
a survivor of a silent partition waits in its collectives (gloo: 30 minutes) and at its exit barrier.

Before a launch, every host gets the group's newest complete checkpoint (`sync_checkpoints`): c10d
assigns ranks itself and only global rank 0 saves, so the saver of one launch may be rank 1 the
next time, and every rank must resume from the same state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from remote.errors import AgentError, BadInput
from specops.contract import commandline
from specops.contract.protocol import Endpoint

if TYPE_CHECKING:
    from remote.inventory import Host, Inventory
    from remote.session import HostSession
    from remote.ssh import Connection

RDZV_PORT = 29400  # the rendezvous's port on the first host unless --port (a pipeline's training: PORT+1)
POLL_S = 1.0
Check = Callable[["Connection", "Host"], Any]  # a host's run check (+ doctor), handed in by the task


def train_across(members: list[Host], inventory: Inventory, run: str, check: Check, *, port: int,
                 epochs: int | None, fresh: bool) -> tuple[dict[str, Any], str | None]:
    """`train --hosts a,b`: every host checked in parallel (one refusing: nothing launched anywhere), stale
    jobs stopped, checkpoints synced, one node job per host launched together and watched as one.
    (the document, the failure's one line or None)."""
    from remote.several_hosts import first_failure
    from specops.contract.progress import say

    started = time.perf_counter()
    names = ", ".join(member.name for member in members)
    with TrainingNodes(members, inventory) as nodes:
        first_failure(nodes.each(lambda session: check(session.conn, session.host)), "check",
                      "; nothing was launched on any host")
        nodes.check_training_network(run, port)
        stale = nodes.stop_stale(run)
        if stale:
            say(f"stopped a leftover train job of {run} on {', '.join(stale)}")
        synced = nodes.sync_checkpoints(run)
        if synced.get("copied_to"):
            say(f"checkpoint {synced['epoch']} copied from {synced['source']} to {', '.join(synced['copied_to'])}")
        rdzv_id = nodes.launch(run, port, epochs=epochs, fresh=fresh)
        say(f"training {run} across {names} (group {rdzv_id})")
        outcome = nodes.watch()
    document = {"ok": outcome.ok, "run": run, "group": rdzv_id, "stopped_stale": stale, "synced": synced,
                **outcome.as_dict(), "elapsed_s": round(time.perf_counter() - started, 3)}
    failure = None if outcome.ok else (
        f"train across {names}: {outcome.failed_host}: {outcome.why}; "
        f"stopped the group ({', '.join(outcome.stopped) or 'nothing else was running'})")
    return document, failure


def rendezvous_endpoint(host: Host, port: int) -> Endpoint:
    """HOST0:PORT as the other hosts reach it: the first host's training address, else the address its
    connection kind gives (the builders write it on the command line; the agent parses it back once)."""
    from remote.ssh import kind_of

    return Endpoint(host.train_address or kind_of(host).peer_address(host), port)


def node_step_args(run: str, rank: int, count: int, endpoint: Endpoint | str, rdzv_id: str, *, epochs: int | None,
                   fresh: bool, host: Host | None = None, dry_run: bool = False) -> list[str]:
    """One node's `step train` of the group; the host's training network (inventory) when it names one."""
    return commandline.step_train(run=run, nnodes=count, node_rank=rank, rdzv_endpoint=endpoint, rdzv_id=rdzv_id,
                                 local_addr=(host and host.train_address) or None,
                                 interface=(host and host.train_interface) or None, epochs=epochs, fresh=fresh,
                                 dry_run=dry_run)


@dataclass
class TrainingOutcome:
    ok: bool
    states: dict[str, str | None]
    jobs: dict[str, str]
    failed_host: str | None = None
    why: str | None = None
    stopped: list[str] = field(default_factory=list)
    detected_after_s: float | None = None  # from the failure being seen to every other job stopped

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "states": self.states, "jobs": self.jobs, "failed_host": self.failed_host,
                "why": self.why, "stopped": self.stopped, "stop_took_s": self.detected_after_s}


class TrainingNodes:
    """The hosts of one training, each with its one session (connection) for the whole task."""

    def __init__(self, hosts: list[Host], inventory: Inventory) -> None:
        from remote.session import HostSession

        self.hosts = hosts
        self.inventory_path = inventory.path
        self.sessions: dict[str, HostSession] = {host.name: HostSession(host, inventory) for host in hosts}
        self.jobs: dict[str, str] = {}

    def __enter__(self) -> TrainingNodes:
        return self

    def __exit__(self, *exc: object) -> None:
        for session in self.sessions.values():
            session.close()

    def each(self, work: Callable[[HostSession], Any]) -> dict[str, Any]:
        """`work(session)` on every host in parallel: its value, or the SpecopsError it raised."""
        from remote.several_hosts import each

        return each(self.sessions, work)

    def sync_checkpoints(self, run: str) -> dict[str, Any]:
        """Give every host the newest complete checkpoint any of them holds; what was copied where."""
        from remote.agent import agent_call

        def state(session: HostSession) -> dict[str, Any]:
            result = agent_call(session.conn, session.host, commandline.step_metrics(run=run, no_plot=True))
            if not result.ok:
                raise AgentError(f"{session.host.name}: {result.document.get('error')}")
            return result.document["checkpoints"]

        states = self.each(state)
        failures = {name: value for name, value in states.items() if isinstance(value, Exception)}
        if failures:
            raise AgentError(f"checkpoint sync: {next(iter(failures.values()))}")
        newest = {name: value.get("newest_epoch") for name, value in states.items()}
        known = [epoch for epoch in newest.values() if epoch is not None]
        if not known:
            return {"epoch": None, "copied_to": []}
        epoch = max(known)
        source = next(name for name, value in newest.items() if value == epoch)
        behind = [name for name, value in newest.items() if value != epoch]
        archive = self._tar_out(source, states[source]["folder"], str(epoch))
        for name in behind:
            self._tar_in(name, states[name]["folder"], archive)
        return {"epoch": epoch, "source": source, "copied_to": behind, "bytes": len(archive)}

    def run_checked(self, name: str, argv: list[str], what: str, *, stdin: bytes | None = None,
                    timeout: float = 1800) -> bytes:
        """`argv` on host `name` over its verified connection; its stdout, or AgentError naming the host,
        `what` was being done and the tail of its stderr."""
        result = self.sessions[name].conn.run(argv, stdin=stdin, timeout=timeout)
        if result.exit_code != 0:
            raise AgentError(f"{name}: {what}: {result.stderr.decode(errors='replace')[-300:]}")
        return result.stdout

    def _tar_out(self, name: str, folder: str, entry: str) -> bytes:
        return self.run_checked(name, ["tar", "-C", folder, "-cf", "-", entry], f"tar of {folder}/{entry}",
                                timeout=600)

    def _tar_in(self, name: str, folder: str, archive: bytes) -> None:
        # unpack beside, then rename into place: a cut transfer never leaves a half checkpoint
        script = ('set -e; mkdir -p "$1"; tmp=$(mktemp -d "$1/.incoming-XXXXXX"); tar -C "$tmp" -xf -; '
                  'for entry in "$tmp"/*; do rm -rf "$1/$(basename "$entry")"; mv "$entry" "$1/"; done; '
                  'rmdir "$tmp"')
        self.run_checked(name, ["sh", "-c", script, "sync", folder], f"unpacking the checkpoint into {folder}",
                         stdin=archive, timeout=600)

    def check_training_network(self, run: str, port: int) -> None:
        """Every host whose inventory names a training network holds it, before any node starts: a dry
        run of its node on the host; bad input names the inventory file, the host and the key."""
        from remote.agent import agent_call

        endpoint = rendezvous_endpoint(self.hosts[0], port)
        keys = {"--local-addr": "train_address", "--interface": "train_interface"}

        def check(session: HostSession) -> tuple[int, str] | None:
            host = session.host
            if not (host.train_address or host.train_interface):
                return None  # nothing to check: torch's own choice
            args = node_step_args(run, 0, len(self.hosts), endpoint, "check", epochs=None, fresh=False, host=host,
                                  dry_run=True)
            result = agent_call(session.conn, host, args)
            return None if result.ok else (result.exit_code, str(result.document.get("error")))

        results = self.each(check)
        for name, value in results.items():  # the training network's problems first, in inventory terms
            if isinstance(value, tuple) and (flag := value[1].partition(": ")[0]) in keys:
                raise BadInput(f"{self.inventory_path}: hosts.{name}.{keys[flag]}: {value[1].partition(': ')[2]}")
        for name, value in results.items():
            if isinstance(value, Exception):
                raise value
            if value is not None:
                raise (BadInput if value[0] == 2 else AgentError)(f"{name}: {value[1]}")

    def stop_stale(self, run: str) -> list[str]:
        """Stop a train job of this run still running anywhere (a survivor of a partition, say)."""
        from remote.jobs import job_call
        from specops.contract.protocol import ACTIVE_STATES

        def stop(session: HostSession) -> bool:
            listed = job_call(session.conn, session.host, commandline.job_list(all=True))["jobs"]
            active = [job for job in listed if job["name"] == "train" and job.get("run") == run
                      and job["state"] in ACTIVE_STATES]
            for job in active:
                job_call(session.conn, session.host, commandline.job_stop(job=job["id"], grace=5))
            return bool(active)

        results = self.each(stop)
        failed = {name: value for name, value in results.items() if isinstance(value, Exception)}
        if failed:
            raise AgentError(f"before the launch: {next(iter(failed.values()))}")
        return sorted(name for name, value in results.items() if value is True)

    def launch(self, run: str, port: int, *, epochs: int | None, fresh: bool) -> str:
        """One node job per host, all launched at once; the rendezvous id of this launch."""
        from remote.launch import agent_step_command, launch

        rdzv_id = f"{run}-{time.strftime('%Y%m%d-%H%M%S')}"
        endpoint = rendezvous_endpoint(self.hosts[0], port)
        ranks = {host.name: rank for rank, host in enumerate(self.hosts)}

        def start(session: HostSession) -> str:
            args = node_step_args(run, ranks[session.host.name], len(self.hosts), endpoint, rdzv_id,
                                  epochs=epochs, fresh=fresh, host=session.host)
            job = launch(session.conn, session.host, "train", agent_step_command(session.host, args), run=run,
                         meta={"group": rdzv_id, "hosts": [host.name for host in self.hosts]})
            return job["id"]

        started = self.each(start)
        self.jobs = {name: value for name, value in started.items() if isinstance(value, str)}
        failed = {name: value for name, value in started.items() if not isinstance(value, str)}
        if failed:
            self.stop_all()
            raise AgentError(f"group launch: {next(iter(failed.values()))}; the other hosts' jobs were stopped")
        return rdzv_id

    def records(self) -> dict[str, Any]:
        """Every host's job record (its state, when it ended), or the SpecopsError asking it raised."""
        from remote.jobs import job_call

        def show(session: HostSession) -> dict[str, Any]:
            return job_call(session.conn, session.host, commandline.job_show(job=self.jobs[session.host.name]))["job"]

        return self.each(show)

    def stop_all(self, but: str | None = None) -> list[str]:
        """Stop every host's job of this group (except `but`'s); the hosts where one was stopped."""
        from remote.jobs import job_call

        def stop(session: HostSession) -> bool:
            name = session.host.name
            if name == but or name not in self.jobs:
                return False
            document = job_call(session.conn, session.host, commandline.job_stop(job=self.jobs[name], grace=5))
            return not document.get("already_ended")

        return sorted(name for name, value in self.each(stop).items() if value is True)

    def watch(self, on_poll: Callable[[dict[str, Any]], None] | None = None, what: str = "train") -> TrainingOutcome:
        """Until every job succeeded, or one host's job failed or the host went silent: then stop the rest."""
        from specops.contract.protocol import JobState

        while True:
            records = self.records()
            states = {name: (value if isinstance(value, Exception) else value["state"])
                      for name, value in records.items()}
            if on_poll:
                on_poll(states)
            cause = first_to_fail(records)
            if cause is not None:
                seen = time.monotonic()
                value = records[cause]
                why = str(value) if isinstance(value, Exception) else f"its {what} job {value['state']}"
                stopped = self.stop_all(but=cause)
                shown = {name: (None if isinstance(value, Exception) else value) for name, value in states.items()}
                return TrainingOutcome(False, shown, self.jobs, cause, why, stopped,
                                       round(time.monotonic() - seen, 2))
            if all(value == JobState.SUCCEEDED for value in states.values()):
                return TrainingOutcome(True, dict(states), self.jobs)
            time.sleep(POLL_S)


def first_to_fail(records: dict[str, Any]) -> str | None:
    """The host that ended the group: one gone silent (its peers' failures follow from it), else the one
    whose job ended first other than succeeded — a killed node's peers fail a moment later in their
    collectives, and a poll may see them all ended at once. None while nothing failed."""
    from specops.contract.protocol import ACTIVE_STATES, JobState

    silent = [name for name, value in records.items() if isinstance(value, Exception)]
    if silent:
        return silent[0]
    failed = [(value.get("ended") or "", name) for name, value in records.items()
              if value["state"] not in ACTIVE_STATES and value["state"] != JobState.SUCCEEDED]
    return min(failed)[1] if failed else None
