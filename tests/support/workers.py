"""A pytest plugin for the test command's two workers (pytest-xdist, `--dist loadgroup`).

loadgroup hands out ungrouped tests one by one, so the tests of a module that share a module-scoped
fixture (a two-host pipeline, a trained draft, a network namespace) would each worker set it up
again. Such a module becomes a group of its own here, kept in one worker; an explicit
`xdist_group` mark wins (the serve env's group keeps every test of .venv-vllm together).

The long units go first (the longest-first rule of scheduling): the serve env's group (a third of
the suite's time), then the other groups (a module fixture: a two-host pipeline, a training group, a
partitioned network), then the single tests marked slow, then the rest. In file order, a group of a
minute or two came near the end and the other worker, out of work, waited for it. The order within a
group, and within each of these four kinds, stays the file order.

The serve env (.venv-vllm) is shared by both workers: its tests (marked `serve_env`) used to be one group in
one worker, and that worker's 36 minutes were the suite's wall time while the other worker idled at the end.
What made them one group was one test that reverts the env's patch set for a while; now every `serve_env`
test holds a shared lock on the env for its whole run (fixtures included) and that test (`serve_env_exclusive`)
an exclusive one, so it never runs beside a user of the env, and the rest run in both workers. The patch set
is applied once, before the workers start (tests/conftest.py's pytest_configure, in the controlling process).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# The lock file beside the serve env (every worker of every session on this checkout sees the same one)
SERVE_ENV_LOCK = Path(__file__).resolve().parents[2] / ".venv-vllm.lock"


def serve_env_lock() -> Path:
    """SPECOPS_SERVE_ENV_LOCK (a suite of its own, as tests/house runs one), else the checkout's."""
    return Path(os.environ.get("SPECOPS_SERVE_ENV_LOCK") or SERVE_ENV_LOCK)


def uses_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(definitions and definitions[-1].scope == "module" for definitions in info.name2fixturedefs.values())


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook writes the group into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None and uses_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else item.nodeid))
    items.sort(key=scheduling_rank)  # stable: file order within each rank


def scheduling_rank(item: pytest.Item) -> int:
    """0 a test of the serve env (its servers are the longest units), 1 another group, 2 a single slow test,
    3 the rest."""
    if item.get_closest_marker("serve_env") is not None or item.get_closest_marker("serve_env_exclusive"):
        return 0
    if item.get_closest_marker("xdist_group") is not None:
        return 1
    return 2 if item.get_closest_marker("slow") is not None else 3


def serve_env_lock_mode(item: pytest.Item) -> int | None:
    """fcntl.LOCK_EX for a test that changes the serve env, LOCK_SH for one that uses it, None otherwise."""
    if item.get_closest_marker("serve_env_exclusive") is not None:
        return fcntl.LOCK_EX
    return fcntl.LOCK_SH if item.get_closest_marker("serve_env") is not None else None


@contextmanager
def holding_serve_env(exclusive: bool) -> Iterator[None]:
    """The serve env's lock (flock: released when the descriptor closes, or its process dies)."""
    descriptor = os.open(serve_env_lock(), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(descriptor)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """The serve env's lock held through the test's setup (module fixtures start servers there), call and
    teardown."""
    mode = serve_env_lock_mode(item)
    if mode is None:
        yield
        return
    with holding_serve_env(exclusive=mode == fcntl.LOCK_EX):
        yield
