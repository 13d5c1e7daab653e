"""The train step of a role split (the run's `hosts: {serve: [...], train: [...]}`, hidden_states.mode online):
servers on some hosts, the trainer on another, the states on a folder both see (hidden_states.shared_dir).

    serve host   starts (or reuses) the run's vLLM server, the producer: it listens where the train host
                 reaches it (the inventory's train_address; loopback when the hosts share a machine) and
                 writes each row's states into its own folder under shared_dir. It publishes its endpoint at
                 the rendezvous, then waits for the training: a train host that fails or goes silent ends the
                 wait with that host's one line.
    train host   speculators' trainer, the consumer (`--vllm-endpoint` the serve hosts' servers, `--on-missing
                 generate`; several: a list, row i asking server i mod n, patch set speculators-0.9.0-endpoints):
                 it loads each row's file from the shared folder and deletes it. Watched: each server
                 answering, the serve hosts' engines heard, the disk budget; the first that fails stops the
                 trainer with one line naming the serve host.
The same command resumes from the newest checkpoint (the engine skips what is done; speculators resumes).

Sample accounting: the serve host's server counts its finished requests (vLLM's request_success_total). The
trainer asks once for each row of each epoch (no row has a file: the trainer deletes each one it loads), so
a launch that trains epochs first..E-1 of R rows from their start serves (E - first) x R requests: the
report's `accounting` puts the two side by side. A launch stopped mid-epoch leaves that epoch unsaved (a
checkpoint is written at an epoch's end): the rerun trains it again from its start, so no row of a saved
epoch is missing or counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.contract.errors import BadInput, CheckFailed
from specops.pipeline.training import online

if TYPE_CHECKING:
    from specops.pipeline.run import Run, StepContext, StepReport

VERIFIERS = "role-verifiers"  # the rendezvous tag under which the train hosts publish their target's path
ENDPOINTS = "role-endpoints"  # ... and every serve host its server
TRAINED = "role-trained"      # ... and the train hosts their outcome, which the serve hosts wait for
DOWN_LOOKS = 3                # the server unanswered this many looks in a row (a look a second): dead
LOOPBACK = "127.0.0.1"


def is_serve_host(context: StepContext) -> bool:
    return bool(context.train_ranks) and context.hosts.rank not in context.train_ranks


def serve_index(context: StepContext) -> int:
    """This serve host's place among the serve hosts (train host j asks serve host j mod their count)."""
    return [rank for rank in range(context.hosts.count) if rank not in context.train_ranks].index(context.hosts.rank)


def serve_for_trainers(context: StepContext) -> StepReport:
    """A serve host's part: the server up and published, then the training waited for."""
    from specops.host.gpus import device_count
    from specops.pipeline import vllm

    run, hosts = context.run, context.hosts
    address = context.training.local_addr if context.training is not None else None
    advertised = address or LOOPBACK
    # on its own machine the server must be reached from the train host's: every interface (the training
    # network, where torchrun's store is reached too); loopback when the hosts share one machine
    listen = LOOPBACK if advertised in (LOOPBACK, "localhost") else "0.0.0.0"
    port = run.config.vllm.port + hosts.rank  # two serve nodes on one machine never collide
    # speculators' trainer asks for the model by its own path to the target (its --verifier-name-or-path) and
    # refuses a server that serves another name: the server takes the name of its train host's path
    verifiers = [path for path in hosts.all_gather(VERIFIERS, None) if path is not None]
    trainer_of_mine = verifiers[serve_index(context) % len(verifiers)]
    server = vllm.start_server_job(run, device_count(), port=port, listen=listen, served_name=trainer_of_mine)
    published = {"host": context.name, "endpoint": f"http://{advertised}:{port}/v1", "address": advertised,
                 "port": port, "job": server.record["id"], "staging": str(server.staging or vllm.staging_dir(run))}
    hosts.all_gather(ENDPOINTS, published)
    outcomes = hosts.all_gather(TRAINED, None)  # a train host that fails ends this wait with its line
    trained = next(outcome for outcome in outcomes if outcome is not None)
    return {"step": "train", "status": "served", "role": "serve", "server": published, "saver": trained["saver"],
            "saved_on": trained["host"]}


def train_against_servers(context: StepContext, train: Any) -> StepReport:
    """A train host's part: `train(remote)` (training.step.train_step with its servers) trains."""
    hosts = context.hosts
    hosts.all_gather(VERIFIERS, str(context.run.model_path))
    servers = [entry for entry in hosts.all_gather(ENDPOINTS, None) if entry is not None]
    # train host j asks serve hosts j, j + T, j + 2T ... of the T train hosts (as serve host k serves under
    # train host k mod T's path); `train:` is one host, so: all of them. Several servers need the trainer's
    # endpoint list (patch set speculators-0.9.0-endpoints)
    place, count = list(context.train_ranks).index(hosts.rank), len(context.train_ranks)
    mine = servers[place::count] or [servers[place % len(servers)]]
    if len(mine) > 1:
        refuse_without_endpoint_list(len(mine))
    remote = RemoteServers(mine, context)
    document = train(remote)
    hosts.all_gather(TRAINED, {"host": context.name, "saver": hosts.rank})
    return {**document, "role": "train", "saver": hosts.rank, "saved_on": context.name,
            "roles": {"served_by": remote.host, "endpoint": remote.endpoint, "accounting": document.get("accounting")}}


ENDPOINT_LIST = "speculators-0.9.0-endpoints"


def refuse_without_endpoint_list(servers: int, *, before_patches: bool = False) -> None:
    """Several servers for one trainer: only where this host's speculators takes a list of endpoints (the
    patch set applied; `before_patches`: at the run check, before the patches step, the set fits)."""
    from specops.patching import apply_sets, verify_sets

    checked = apply_sets([ENDPOINT_LIST], dry_run=True) if before_patches else verify_sets([ENDPOINT_LIST])
    entry = next(iter(checked.get("sets", [])), {})
    if not checked.get("ok") or not entry.get("applicable"):
        why = entry.get("reason") or entry.get("detail") or checked.get("error") or "not applied"
        raise CheckFailed(f"{servers} serve hosts for one trainer need speculators to ask several servers (patch "
                          f"set {ENDPOINT_LIST}: {why}); name one serve host, or install speculators 0.9.0")


@dataclass
class RemoteServers:
    """The serve hosts' servers as the train host sees them: their endpoints (the trainer's row i asks
    server i mod n), whether each answers, their counters summed."""

    published: list[dict[str, Any]]
    context: StepContext
    served_before: dict[str, float | None] = field(default_factory=dict)
    _unanswered: dict[str, int] = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        """speculators' --vllm-endpoint: one server, or the comma-separated list of them."""
        return ",".join(entry["endpoint"] for entry in self.published)

    @property
    def host(self) -> str:
        return ",".join(entry["host"] for entry in self.published)

    @property
    def jobs(self) -> str:
        return ", ".join(f"{entry['host']}:{entry['job']}" for entry in self.published)

    def readings(self) -> dict[str, dict[str, float] | None]:
        """Each serve host's server's request counters (vLLM's /metrics), None where it does not answer."""
        from specops.pipeline.vllm import request_counters

        return {entry["host"]: request_counters(int(entry["port"]), address=entry["address"])
                for entry in self.published}

    def counters(self) -> dict[str, float] | None:
        """Every server's request counters summed; None while any of them does not answer."""
        readings = list(self.readings().values())
        if any(reading is None for reading in readings):
            return None
        return {key: sum(reading[key] for reading in readings) for key in readings[0]}  # type: ignore[index]

    def served_since(self) -> dict[str, float | None]:
        """Each server's finished requests since `serving` began (None where unknown)."""
        now = self.readings()
        return {host: None if reading is None or self.served_before.get(host) is None
                else reading["finished"] - self.served_before[host]  # type: ignore[operator]
                for host, reading in now.items()}

    def problem(self) -> str | None:
        """None while every server answers and the serve hosts' engines are heard; else one line naming
        the host."""
        from specops.pipeline.vllm import request_counters

        gone = self.context.hosts.gone()
        if gone:
            return f"serve host {gone}"
        for entry in self.published:
            if request_counters(int(entry["port"]), address=entry["address"]) is not None:
                self._unanswered[entry["host"]] = 0
                continue
            self._unanswered[entry["host"]] = looks = self._unanswered.get(entry["host"], 0) + 1
            if looks >= DOWN_LOOKS:
                return (f"serve host {entry['host']}: its vLLM server (job {entry['job']}, {entry['endpoint']}) "
                        f"stopped answering during training")
        return None

    def placement(self, gpus: int) -> online.Placement:
        """Every GPU of the train host is the trainer's: the servers run elsewhere."""
        every = tuple(range(gpus))
        return online.Placement("remote", (), every, None, f"the server runs on {self.host}")

    def serving(self, run: Run, placement: online.Placement) -> RemoteServing:
        from specops.pipeline.extraction import budget_bytes

        self.served_before = {host: None if reading is None else reading["finished"]
                              for host, reading in self.readings().items()}
        folders = (run.paths.hidden_states, *(Path(entry["staging"]) for entry in self.published))
        watch = online.Watch(folders, budget_bytes(run.config.hidden_states.disk_budget_gb), self.problem,
                             run.paths.run_dir / online.STATE_FILE, counters=self.counters, server_job=self.jobs)
        return RemoteServing(self, placement, watch)


@dataclass
class RemoteServing:
    """online.Serving's face for a server on another host (train_step drives either)."""

    remote: RemoteServers
    placement: online.Placement
    watch: online.Watch

    def describe(self) -> dict[str, Any]:
        return {"host": self.remote.host, "job": self.remote.jobs, "endpoint": self.remote.endpoint,
                "staging": [entry["staging"] for entry in self.remote.published]}

    def trainer_env(self) -> dict[str, str]:
        return {}

    def failure(self, code: int, pid: int | None, log: Path) -> str:
        resume = "run the same command to resume from the newest checkpoint"
        if self.watch.reason:
            return f"{self.watch.reason}; specops stopped the trainer; {resume} (log: {log})"
        if reason := self.remote.problem():
            return f"{reason}; {online.ended_how(code, pid)}; {resume} (log: {log})"
        return f"{online.ended_how(code, pid)}; {resume} (log: {log})"

    def accounting(self, rows: int, first_epoch: int, epochs: int) -> dict[str, Any]:
        """The server's requests during this launch beside what the epochs it trained ask for."""
        each = self.remote.served_since()
        served = None if None in each.values() else sum(each.values())  # type: ignore[arg-type]
        trained = epochs - first_epoch
        return {"rows": rows, "epochs_trained": trained, "expected_requests": rows * trained,
                "served_requests": served, "server": self.remote.jobs,
                "served_by_host": each}


def refuse_unless_ready(context: StepContext) -> None:
    """Before any step: roles given on the command line (--hosts "serve=..;train=..") meet the run config's
    hidden-state settings by the rule its own `hosts: {serve, train}` meets (run.config.roles_problem); a
    train host with several serve hosts can ask them all."""
    from specops.pipeline.run import roles_problem

    run = context.run
    if problem := roles_problem(run.config.hidden_states):
        raise BadInput(f"{run.label}: {problem}")
    serve_hosts = context.hosts.count - len(context.train_ranks)
    if context.hosts.rank in context.train_ranks and serve_hosts > len(context.train_ranks):
        refuse_without_endpoint_list(serve_hosts, before_patches=True)
