"""`patch verify --deep`: targets imported in a child of the host's python, calls bound with inspect.

A generated pair of packages shows what only the live pass can see (a wrapped function, a callable
built at run time, a callee whose module fails to import); the real speculators 0.3.0 tree shows that
a target which cannot be imported leaves every call unknown, never ok.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.patching.conftest import SET_NAME, Host
from tests.support.agent import run_agent

CALLER = '''\
from newlib import registry
from newlib.api import Engine, build


def run():
    build(1, 2, mode="fast")
    Engine(1)
    registry.lookup("a", strict=True)


def on_gpu():
    from newlib.gpu import kernel

    return kernel(1)
'''
NEWLIB = {
    "newlib/__init__.py": "",
    "newlib/api.py": '''\
        import functools


        def _traced(function):
            @functools.wraps(function)
            def wrapper(*args, **kwargs):
                return function(*args, **kwargs)
            return wrapper


        @_traced
        def build(model, *, mode="auto"):
            return model


        class Engine:
            def __init__(self, config):
                self.config = config
        ''',
    "newlib/registry.py": '''\
        def _make():
            def lookup(name, *, strict=False):
                return name
            return lookup


        lookup = _make()
        ''',
    "newlib/gpu.py": '''\
        raise RuntimeError("no GPU visible")


        def kernel(size):
            return size
        ''',
}
PATCH = '''\
id = "engine-config-keyword"
reason = "newlib 2 names the Engine's argument"
module = "oldlib.worker"

[[replace]]
old = """
    Engine(1)
"""
new = """
    Engine(config=1)
"""
'''


def distribution(site: Path, name: str, version: str) -> None:
    dist_info = site / f"{name}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """(site, workdir): oldlib 1.0 calling into newlib 2.0, and a one-patch set for oldlib."""
    site = tmp_path / "site"
    for relative, text in {"oldlib/__init__.py": "", "oldlib/worker.py": CALLER, **NEWLIB}.items():
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_text(textwrap.dedent(text))
    distribution(site, "oldlib", "1.0")
    distribution(site, "newlib", "2.0")
    patches = tmp_path / "work" / "patches" / "oldlib-1"
    patches.mkdir(parents=True)
    (patches / "set.toml").write_text('package = "oldlib"\nversion = "==1.0"\n[requires]\nnewlib = ">=2"\n')
    (patches / "01-engine-config-keyword.toml").write_text(PATCH)
    return site, tmp_path / "work"


def agent(site: Path, workdir: Path, *args: str) -> tuple[int, dict[str, Any]]:
    code, document, _ = run_agent(workdir, "patch", *args, sites=(site,))
    return code, document


def by_check(document: dict) -> dict[str, dict]:
    return {c["check"]: c for c in document["checks"] if c["target"] == "oldlib.worker"}


def by_line(check: dict) -> dict[int, dict]:
    return {f["line"]: f for f in check["findings"]}


def test_deep_binds_each_call_against_the_imported_callee(pair: tuple[Path, Path]) -> None:
    site, workdir = pair
    assert agent(site, workdir, "apply")[0] == 0

    code, document = agent(site, workdir, "verify", "--deep")

    checks = by_check(document)
    static, live = by_line(checks["calls_bind"]), by_line(checks["calls_live"])
    assert checks["imports_live"]["ok"] is True
    # the wrapper hides build's signature from the static pass; inspect follows __wrapped__
    assert static[6]["status"] == "unknown"
    assert live[6]["status"] == "error" and "too many positional arguments" in live[6]["detail"]
    assert (static[7]["status"], live[7]["status"]) == ("ok", "ok")
    assert "binds live: newlib.api.Engine(config)" in live[7]["detail"]
    # a function made at run time: only the live pass can read it
    assert (static[8]["status"], live[8]["status"]) == ("unknown", "ok")
    # the callee's module raises on import: unknown with the reason, not ok
    assert static[14]["status"] == "ok"
    assert live[14]["status"] == "unknown"
    assert "could not import newlib.gpu.kernel: RuntimeError: no GPU visible" in live[14]["detail"]
    assert checks["calls_live"]["ok"] is False and code == 1
    assert "oldlib/worker.py:6" in checks["calls_live"]["detail"]


def test_without_deep_there_is_no_live_check(pair: tuple[Path, Path]) -> None:
    site, workdir = pair
    agent(site, workdir, "apply")

    code, document = agent(site, workdir, "verify")

    assert code == 0
    assert not {"imports_live", "calls_live"} & set(by_check(document))


@pytest.mark.wheels
@pytest.mark.slow  # long: scheduled among the first (tests/support/workers.py)
def test_a_target_that_cannot_be_imported_leaves_every_call_unknown(host: Host) -> None:
    assert host.agent("apply")[0] == 0

    code, document = host.agent("verify", "--deep", "--set", SET_NAME)

    assert code == 1
    imports = [c for c in document["checks"] if c["check"] == "imports_live"]
    calls = [c for c in document["checks"] if c["check"] == "calls_live"]
    assert len(imports) == len(calls) == 2
    assert all(not c["ok"] and c["detail"].startswith(f"import {c['target']} failed: ") for c in imports)
    for check in calls:
        assert check["status"] == "unknown" and check["findings"]
        assert {f["status"] for f in check["findings"]} == {"unknown"}
        assert all(f["detail"].startswith(f"import {check['target']} failed: ") for f in check["findings"])
    static = [c for c in document["checks"] if c["check"] in ("calls_bind", "imports_resolve")]
    assert static and all(c["ok"] for c in static)
