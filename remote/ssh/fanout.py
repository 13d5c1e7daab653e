"""Several hosts at once: one callable per host in parallel, and fabric's ThreadingGroup of them.

`fan_out` opens each host's connection in its own thread (Invoke's ExceptionHandlingThread, the
machinery fabric's ThreadingGroup runs on), calls `work(host, conn)` there, and returns every
host's result or error, keyed by host name: one host failing never hides the others' results.
`threading_group` gives the opened SSH hosts as a fabric ThreadingGroup, for commands run the
Invoke way on all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import fabric

    from remote.inventory import Host, Inventory
    from remote.ssh.command import Connection

T = TypeVar("T")


@dataclass
class HostOutcome(Generic[T]):
    host: str
    value: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def fan_out(hosts: Iterable[Host], work: Callable[[Host, Connection], T], *, inventory: Inventory | None = None,
            accept_new_host_key: bool = False) -> dict[str, HostOutcome[T]]:
    """Run `work(host, its connection)` for every host in parallel; each host's outcome by name."""
    from invoke.util import ExceptionHandlingThread

    from remote.ssh import open_connection

    chosen = list(hosts)
    outcomes: dict[str, HostOutcome[T]] = {host.name: HostOutcome(host.name) for host in chosen}

    def one(host: Host) -> None:
        with open_connection(host, accept_new_host_key=accept_new_host_key, inventory=inventory) as conn:
            outcomes[host.name].value = work(host, conn)

    threads = {host.name: ExceptionHandlingThread(target=one, args=(host,)) for host in chosen}
    for thread in threads.values():
        thread.start()
    for name, thread in threads.items():
        thread.join()
        wrapper: Any = thread.exception()
        if wrapper is not None:
            outcomes[name].error = wrapper.value
    return outcomes


def threading_group(connections: Iterable[Any]) -> fabric.ThreadingGroup:
    """fabric's ThreadingGroup of already opened (so already verified) SSH connections."""
    import fabric

    return fabric.ThreadingGroup.from_connections([conn.fabric for conn in connections])
