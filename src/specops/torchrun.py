"""One member of a torchrun group across hosts: the one type for a training node, wherever it is made.

`step train --nnodes K --node-rank I --rdzv-endpoint HOST0:PORT --rdzv-id ID` and the pipeline's node of a
run across hosts (`pipeline --hosts ... --rendezvous HOST0:PORT`, whose training meets at PORT+1) both
become a `TorchrunNode`; its endpoint is an `Endpoint` (host, port), parsed once where the command line is
read (specops.commandline) and written out again only on torchrun's own command line. Standard library
only: the run room (`StepContext.training`) and the training room both read it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from specops.protocol import Endpoint


@dataclass(frozen=True)
class TorchrunNode:
    """This host's place in a training over several hosts: torchrun's c10d rendezvous at node 0."""

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
