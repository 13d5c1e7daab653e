"""A pytest plugin for the test command's two workers (pytest-xdist, `--dist loadgroup`).

loadgroup hands out ungrouped tests one by one, so the tests of a module that share a module-scoped
fixture (a two-host pipeline, a trained draft, a network namespace) would each worker set it up
again. Such a module becomes a group of its own here, kept in one worker; an explicit
`xdist_group` mark wins (the serve env's group keeps every test of .venv-vllm together).
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
