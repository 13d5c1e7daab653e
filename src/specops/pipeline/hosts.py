"""The hosts of one run across K hosts: the engine's nodes meeting at a rendezvous on the first host.

Every host runs the same engine as its own tmux job (node rank i of K), torchrun-style; the nodes meet
at torch's TCPStore, hosted by node 0's engine (the store torchrun's c10d rendezvous uses too). Through
it they wait for each other between steps (barriers), share small JSON (each host's plan of a share)
and copy files to the hosts that lack them (each written beside its final name, then renamed in:
specops.host.atomic). No node depends on the workstation that launched it.

A node that fails publishes why before it exits; the others stop at their next wait naming it. A node
killed -9, or a host cut off, stops beating: the others give up on it after SILENT_S and say so, at
their next wait or, while they train, through `gone` (the trainer's watch asks it every beat).
SPECOPS_SILENT_S in the engine's environment sets another SILENT_S (tests shorten it).

The training of such a run, and `step train --nnodes K`, is a torchrun group across the same hosts: its
member here is a `TorchrunNode` (standard library only: the run room's `StepContext.training` and the
training room read it without the rendezvous).
"""

from __future__ import annotations

import ipaddress
import json
import os
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from specops.contract.errors import BadInput, CheckFailed
from specops.contract.protocol import Endpoint, stays_inside
from specops.host import atomic

BEAT_S = 2.0
SILENT_S = 60.0     # no beat for this long: the node's engine is gone (killed, its host down or cut off)
CONNECT_S = 300.0   # how long a node waits for the first host's store (the hosts are launched together)
POLL_S = 0.1
CHUNK = 4 << 20     # TCPStore's libuv server takes values of at most 8 MiB
# What the store raises when it cannot be reached (torch's DistError and its kinds are RuntimeErrors; older
# torch raised RuntimeError itself). Anything else is a bug here and surfaces as one, with its traceback.
STORE_ERRORS = (RuntimeError,)


def silent_s() -> float:
    """SILENT_S, or SPECOPS_SILENT_S from the environment (a positive number of seconds)."""
    text = os.environ.get("SPECOPS_SILENT_S")
    if not text:
        return SILENT_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise BadInput(f"SPECOPS_SILENT_S: expected a positive number of seconds, got {text!r}")
    return value


class Rendezvous:
    """This node's view of the K hosts (specops.pipeline.run.context.Hosts)."""

    def __init__(self, names: list[str], rank: int, address: str, port: int, group: str) -> None:
        from torch.distributed import TCPStore

        self.names, self.rank, self.count = names, rank, len(names)
        self.prefix = f"{group}/"
        self.silent_s = silent_s()
        try:
            self.store = TCPStore(address, port, self.count, rank == 0, timedelta(seconds=CONNECT_S),
                                  wait_for_workers=False)
        except STORE_ERRORS as exc:
            raise CheckFailed(f"{names[rank]}: the rendezvous at {address}:{port} on {names[0]}: {exc}") from None
        self._beats: dict[int, tuple[int, float]] = {}
        self._looking = threading.Lock()  # the engine's waits and the trainer's watch share the beats seen
        self._stopped = threading.Event()
        self._beating = threading.Thread(target=self._beat, daemon=True, name="specops-beat")
        self._beating.start()

    def _key(self, *parts: object) -> str:
        return self.prefix + "/".join(str(part) for part in parts)

    def _beat(self) -> None:
        while not self._stopped.wait(BEAT_S):
            try:
                self.store.add(self._key("beat", self.rank), 1)
            except STORE_ERRORS:
                return  # the store is gone: the engine's next wait says so

    def close(self) -> None:
        """Leave: the first host, whose engine holds the store, waits for the others to have read
        what they need from it (bounded: a node gone already does not hold it up)."""
        try:
            if self.rank != 0:
                self.store.set(self._key("left", self.rank), b"1")
                return
            keys = [self._key("left", rank) for rank in range(1, self.count)]
            deadline = time.monotonic() + self.silent_s
            while time.monotonic() < deadline and not self.store.check(keys) and not self._silent():
                time.sleep(POLL_S)
        except STORE_ERRORS:
            pass  # the store is gone already: there is nothing left to leave
        finally:
            self._stopped.set()

    def fail(self, message: str) -> None:
        """Tell the other nodes why this one stops (the first failure wins)."""
        try:
            if not self.store.check([self._key("failed")]):
                self.store.set(self._key("failed"), f"{self.names[self.rank]}: {message}")
        except STORE_ERRORS:
            pass  # the store is gone: the others find that out at their next wait

    def _silent(self, after_s: float | None = None) -> str | None:
        """The first other node whose beat has not changed for `after_s` (default: SILENT_S), named."""
        limit = self.silent_s if after_s is None else min(after_s, self.silent_s)
        with self._looking:
            now = time.monotonic()
            for rank in range(self.count):
                if rank == self.rank:
                    continue
                count = self.store.add(self._key("beat", rank), 0)
                seen, since = self._beats.get(rank, (-1, now))
                if count != seen:
                    self._beats[rank] = (count, now)
                elif now - since > limit:
                    return f"{self.names[rank]}: its engine has not been heard for {round(now - since)} s (killed, " \
                           "its host down or cut off)"
        return None

    def gone(self, after_s: float | None = None) -> str | None:
        """Without waiting: why this node cannot go on with the others (one failed and said why, one is
        silent for `after_s`, default SILENT_S, or the store is gone), each naming the host; None while
        every node is heard. The trainer's watch asks it while a training across the hosts runs."""
        try:
            if self.store.check([self._key("failed")]):
                return self.store.get(self._key("failed")).decode()
            return self._silent(after_s)
        except STORE_ERRORS as exc:
            return f"{self.names[0]}: the rendezvous is gone ({exc}): its engine ended"

    def wait(self, keys: list[str]) -> None:
        """Until every key exists; CheckFailed naming the host when one failed or went silent."""
        try:
            while True:
                if self.store.check([self._key("failed")]):
                    raise CheckFailed(self.store.get(self._key("failed")).decode())
                if self.store.check(keys):
                    return
                silent = self._silent()
                if silent:
                    raise CheckFailed(silent)
                time.sleep(POLL_S)
        except STORE_ERRORS as exc:
            raise CheckFailed(f"{self.names[0]}: the rendezvous is gone ({exc}): its engine ended") from None

    def barrier(self, tag: str) -> None:
        self.store.set(self._key(tag, "at", self.rank), b"1")
        self.wait([self._key(tag, "at", rank) for rank in range(self.count)])

    def all_gather(self, tag: str, value: Any) -> list[Any]:
        self.store.set(self._key(tag, "value", self.rank), json.dumps(value).encode())
        keys = [self._key(tag, "value", rank) for rank in range(self.count)]
        self.wait(keys)
        return [json.loads(self.store.get(key)) for key in keys]

    def exchange(self, tag: str, folder: Path, mine: list[str], lacking: bool) -> dict[str, Any]:
        for name in mine:
            if not stays_inside(name):
                raise CheckFailed(f"{folder}: {name!r} would leave the folder")
        offers = self.all_gather(f"{tag}-offers", {"files": mine, "lacking": lacking})
        receivers = [rank for rank, offer in enumerate(offers) if offer["lacking"] and rank != self.rank]
        sent: dict[str, int] = {}
        sender = threading.Thread(target=self._send, args=(tag, folder, mine, len(receivers), sent), daemon=True)
        sender.start()
        received = 0
        if lacking:
            for owner, offer in enumerate(offers):
                if owner == self.rank:
                    continue
                for index, name in enumerate(offer["files"]):
                    if not stays_inside(name):
                        raise CheckFailed(f"{self.names[owner]}: offered {name!r}, which would leave {folder}")
                    received += self._receive(tag, owner, index, folder / name)
        sender.join()
        if "error" in sent:
            raise CheckFailed(f"{self.names[self.rank]}: sending {tag} files: {sent['error']}")
        copies = [{"from": self.names[owner], "to": [self.names[rank] for rank, other in enumerate(offers)
                                                    if other["lacking"] and rank != owner],
                   "files": len(offer["files"])} for owner, offer in enumerate(offers) if offer["files"]]
        copies = [copy for copy in copies if copy["to"]]
        self.barrier(f"{tag}-exchanged")
        return {"copies": copies, "received_bytes": received, "bytes": sent.get("bytes", 0) + received}

    def _send(self, tag: str, folder: Path, mine: list[str], receivers: int, sent: dict[str, Any]) -> None:
        """Each file in chunks under its own keys; the next file once every receiver has this one (the
        store holds at most one file per sender)."""
        sent["bytes"] = 0
        if not receivers:
            return
        try:
            for index, name in enumerate(mine):
                data = (folder / name).read_bytes()
                chunks = [data[start:start + CHUNK] for start in range(0, len(data), CHUNK)] or [b""]
                for number, chunk in enumerate(chunks):
                    self.store.set(self._key(tag, self.rank, index, number), chunk)
                self.store.set(self._key(tag, self.rank, index, "chunks"), str(len(chunks)).encode())
                acks = self._key(tag, self.rank, index, "acks")
                while self.store.add(acks, 0) < receivers:
                    if self.store.check([self._key("failed")]):
                        return
                    time.sleep(POLL_S)
                for number in range(len(chunks)):
                    self.store.delete_key(self._key(tag, self.rank, index, number))
                sent["bytes"] += len(data) * receivers
        except Exception as exc:  # this thread's failure, whatever it is, is every node's: published
            sent["error"] = str(exc)
            self.fail(f"sending {tag} files: {exc}")

    def _receive(self, tag: str, owner: int, index: int, path: Path) -> int:
        count_key = self._key(tag, owner, index, "chunks")
        self.wait([count_key])
        chunks = int(self.store.get(count_key))
        data = b"".join(self.store.get(self._key(tag, owner, index, number)) for number in range(chunks))
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_bytes(path, data)  # beside, then renamed in: a cut copy never has the final name
        self.store.add(self._key(tag, owner, index, "acks"), 1)
        return len(data)


@dataclass(frozen=True)
class TorchrunNode:
    """This host's place in a training over several hosts: torchrun's c10d rendezvous at node 0. Made from
    `step train --nnodes K --node-rank I --rdzv-endpoint HOST0:PORT --rdzv-id ID` or from the pipeline's node
    (whose training meets at its rendezvous PORT+1); its endpoint is parsed once where the command line is
    read (specops.contract.commandline) and written out again only on torchrun's own command line."""

    count: int  # --nnodes
    rank: int  # --node-rank (c10d assigns ranks itself; node 0 is the one hosting the rendezvous)
    endpoint: Endpoint  # HOST0:PORT, reachable from every node
    rdzv_id: str  # one id per launch of the group, so a stale node never joins a new group
    # The host's training network (inventory train_address / train_interface). With an address, the
    # node binds and advertises it (--local-addr) and node 0 hosts the rendezvous store explicitly:
    # torch's guesses go by the hostname, which may resolve to loopback or to another network.
    local_addr: str | None = None
    interface: str | None = None

    def problems(self) -> list[str]:
        """What makes this placement impossible, each a line naming the flag (empty: none)."""
        found = []
        if self.local_addr is not None:
            try:
                ipaddress.ip_address(self.local_addr)
            except ValueError:
                found.append(f"--local-addr: {self.local_addr!r} is not an IP address")
        if self.interface is not None and not is_interface_name(self.interface):
            found.append(f"--interface: {self.interface!r} is not a network interface name")
        if self.count < 2:
            found.append(f"--nnodes: a training over hosts needs at least 2, got {self.count}")
        if not 0 <= self.rank < self.count:
            found.append(f"--node-rank: {self.rank} is not in 0..{self.count - 1}")
        if not self.rdzv_id or not self.rdzv_id.replace("-", "").replace("_", "").isalnum():
            found.append(f"--rdzv-id: {self.rdzv_id!r} is not a simple id (letters, digits, - and _)")
        return found


def is_interface_name(name: str) -> bool:
    """A network interface name as Linux allows it (IFNAMSIZ: at most 15 bytes, no '/' or spaces)."""
    return 0 < len(name) <= 15 and all(char.isalnum() or char in "._-:@" for char in name)
