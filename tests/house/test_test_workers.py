"""The test command's promise about workers holds with the pytest installed: tests marked
`xdist_group("vllm")` run in one worker, in file order (one patch application, one shared server),
and the tests of a module that share a module-scoped fixture run in one worker (it is set up once).

pytest-xdist's loadgroup works by renaming the items it collects; pytest 9 stopped reading the name
it writes, so groups were silently ignored and the serve-env tests ran in both workers at once.
This runs a small suite the way scripts/test.sh runs the real one and reads where each test ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GROUPED = """
import os, pytest
pytestmark = [pytest.mark.xdist_group("vllm")]
{tests}
"""
TEST = """
def test_{name}(tmp_path_factory):
    with open({log!r}, "a") as log:
        log.write("{name} " + str(os.getpid()) + "\\n")
"""


def test_grouped_tests_run_in_one_worker_in_file_order(tmp_path: Path) -> None:
    log = tmp_path / "where.log"
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    order = []
    for module in ("a", "b", "c"):
        names = [f"{module}{index}" for index in range(3)]
        order += names
        body = "".join(TEST.format(name=name, log=str(log)) for name in names)
        (suite / f"test_{module}.py").write_text(GROUPED.format(tests=body))
    (suite / "test_free.py").write_text("".join(f"def test_free{i}():\n    pass\n" for i in range(40)))

    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadgroup", str(suite)], cwd=suite, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ran = [line.split() for line in log.read_text().splitlines()]
    assert [name for name, _ in ran] == order
    assert len({pid for _, pid in ran}) == 1, ran


MODULE_FIXTURE = """
import os, pytest

@pytest.fixture(scope="module")
def costly():
    with open({log!r}, "a") as log:
        log.write("setup " + str(os.getpid()) + "\\n")
    return 1
{tests}
"""
USES_IT = """
def test_{name}(costly):
    assert costly == 1
"""


def test_a_module_fixture_is_set_up_once_for_all_its_tests(tmp_path: Path) -> None:
    from tests.support.repo import REPO

    log = tmp_path / "setups.log"
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "conftest.py").write_text('pytest_plugins = ["tests.support.workers"]\n')
    body = "".join(USES_IT.format(name=f"uses{index}") for index in range(8))
    (suite / "test_shared.py").write_text(MODULE_FIXTURE.format(log=str(log), tests=body))
    (suite / "test_free.py").write_text("".join(f"def test_free{i}():\n    pass\n" for i in range(40)))

    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadgroup", str(suite)], cwd=suite, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "48 passed" in done.stdout
    assert len(log.read_text().splitlines()) == 1, log.read_text()
