"""Several hosts at once: one callable per host in parallel, and fabric's ThreadingGroup of them.

`fan_out` is the one way the control side works on several hosts at once: it calls `work(host, conn)`
for every host, each in its own thread (Invoke's ExceptionHandlingThread, the machinery fabric's
ThreadingGroup runs on), and returns every host's result or error, keyed by host name: one host
failing never hides the others' results. Each host's connection is opened for the work and closed
after it; or, with `sessions` (a task's remote.session.HostSession per host: one connection a host
for the whole task), the session's connection is used and, when the work failed, forgotten (a dead
connection is not reused; the next use opens a fresh one). `threading_group` gives the opened SSH
hosts as a fabric ThreadingGroup, for commands run the Invoke way on all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    import fabric

    from remote.inventory import Host, Inventory
    from remote.ssh.command import Connection

T = TypeVar("T")


class Session(Protocol):
    """A host's one connection for a whole task (remote.session.HostSession), opened on first use."""

    @property
    def conn(self) -> Connection: ...

    def reconnect(self) -> None: ...


@dataclass
class HostOutcome(Generic[T]):
    host: str
    value: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def fan_out(hosts: Iterable[Host], work: Callable[[Host, Connection], T], *, inventory: Inventory | None = None,
            accept_new_host_key: bool = False,
            sessions: Mapping[str, Session] | None = None) -> dict[str, HostOutcome[T]]:
    """Run `work(host, its connection)` for every host in parallel; each host's outcome by name, in the
    hosts' order. With `sessions`, on each host's session connection (see the module's docstring)."""
    from invoke.util import ExceptionHandlingThread

    from remote.ssh import open_connection

    chosen = list(hosts)
    outcomes: dict[str, HostOutcome[T]] = {host.name: HostOutcome(host.name) for host in chosen}

    def one(host: Host) -> None:
        if sessions is None:
            with open_connection(host, accept_new_host_key=accept_new_host_key, inventory=inventory) as conn:
                outcomes[host.name].value = work(host, conn)
            return
        session = sessions[host.name]
        try:
            outcomes[host.name].value = work(host, session.conn)
        except BaseException:
            session.reconnect()
            raise

    if len(chosen) == 1:  # nothing to overlap: no thread
        try:
            one(chosen[0])
        except Exception as exc:
            outcomes[chosen[0].name].error = exc
        return outcomes
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
