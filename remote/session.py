"""Glue for tasks: one inventory load and ONE connection per task, errors mapped to exit statuses.

A task opens a `HostSession`; its launch, its following of the job's log and its fetch all use
the session's one connection. Only after a real drop (a ConnectError) does `reconnect` open a new
one, which is how following a log resumes after a network blip.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from invoke.exceptions import Exit

from remote.errors import BadInput, SpecopsError
from specops.contract.commandline import BadArgument

if TYPE_CHECKING:
    from remote.inventory import Host, Inventory
    from remote.ssh import Connection


class HostSession:
    """An inventory host and, opened on first use, the one connection this task talks to it through."""

    def __init__(self, host: Host, inventory: Inventory | None = None, *, accept_new_host_key: bool = False,
                 quick: bool = False) -> None:
        self.host, self.inventory = host, inventory
        self.accept_new_host_key, self.quick = accept_new_host_key, quick
        self.connects = 0
        self._conn: Connection | None = None

    @property
    def conn(self) -> Connection:
        if self._conn is None:
            from remote.ssh import open_connection

            self._conn = open_connection(self.host, accept_new_host_key=self.accept_new_host_key,
                                         inventory=self.inventory, quick=self.quick)
            self.connects += 1
        return self._conn

    @property
    def round_trips(self) -> int:
        return self._conn.round_trips if self._conn is not None else 0

    def reconnect(self) -> None:
        """Forget a connection that dropped; the next use opens a fresh one."""
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    def __enter__(self) -> HostSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def host_session(host_name: str | None, *, accept_new_host_key: bool = False,
                 quick: bool = False) -> Iterator[HostSession]:
    """The task's session: the inventory loaded once, the host chosen, its connection opened lazily."""
    from remote.inventory import load_inventory

    inventory = load_inventory()
    with HostSession(inventory.host(host_name), inventory, accept_new_host_key=accept_new_host_key,
                     quick=quick) as session:
        yield session


@contextmanager
def host_connection(host_name: str | None, *, accept_new_host_key: bool = False,
                    quick: bool = False) -> Iterator[tuple[Host, Any]]:
    """For a task of one exchange: the host and its connection, opened now (`quick`: see open_connection)."""
    with host_session(host_name, accept_new_host_key=accept_new_host_key, quick=quick) as session:
        yield session.host, session.conn


def fail(message: str, code: int) -> Exit:
    print(f"specops: {message}", file=sys.stderr)
    return Exit(code=code)


def reports_errors(task_function: Callable) -> Callable:
    """Every SpecopsError becomes one line on stderr and its exit status (2 bad input, 1 otherwise); a
    value no agent command takes (commandline.BadArgument) is bad input."""

    @functools.wraps(task_function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return task_function(*args, **kwargs)
        except (SpecopsError, BadArgument) as exc:
            code = exc.exit_code if isinstance(exc, SpecopsError) else BadInput.exit_code
            if kwargs.get("json"):  # --json promises one JSON document on stdout, failures included
                emit_json({"ok": False, "error": str(exc), "exit_code": code})
            raise fail(str(exc), code) from None
        except KeyboardInterrupt:
            raise fail("interrupted", 130) from None

    return wrapper


def emit_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")
    sys.stdout.flush()
