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
"""

from __future__ import annotations

import pytest


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
    """0 the serve env's group, 1 another group, 2 a single slow test, 3 the rest."""
    group = item.get_closest_marker("xdist_group")
    if group is not None:
        return 0 if group.args[:1] == ("vllm",) else 1
    return 2 if item.get_closest_marker("slow") is not None else 3
