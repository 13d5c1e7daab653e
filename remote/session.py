"""Glue for tasks: load the inventory, pick the host, open one connection, map errors to exits."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from invoke.exceptions import Exit

from remote.connection import open_connection
from remote.errors import SpecopsError
from remote.inventory import Host, Inventory, load_inventory


@contextmanager
def host_connection(host_name: str | None, *, accept_new_host_key: bool = False) -> Iterator[tuple[Host, Any]]:
    inventory: Inventory = load_inventory()
    host = inventory.host(host_name)
    with open_connection(host, accept_new_host_key=accept_new_host_key, inventory=inventory) as conn:
        yield host, conn


def fail(message: str, code: int) -> Exit:
    print(f"specops: {message}", file=sys.stderr)
    return Exit(code=code)


def reports_errors(task_function: Callable) -> Callable:
    """Every SpecopsError becomes one line on stderr and its exit status (2 bad input, 1 otherwise)."""

    @functools.wraps(task_function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return task_function(*args, **kwargs)
        except SpecopsError as exc:
            if kwargs.get("json"):  # --json promises one JSON document on stdout, failures included
                emit_json({"ok": False, "error": str(exc), "exit_code": exc.exit_code})
            raise fail(str(exc), exc.exit_code) from None
        except KeyboardInterrupt:
            raise fail("interrupted", 130) from None

    return wrapper


def emit_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")
    sys.stdout.flush()
