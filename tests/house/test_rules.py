"""The rules of the house (../shared/DESIGN.md) hold in the code, and breaking one fails the tests.

The import contracts live in pyproject.toml ([tool.importlinter]; the faces of the pipeline's rooms through
a contract type of ours, tests/support/import_contracts.py) and are checked by `lint-imports`;
the rules import-linter cannot express (private *names*, tasks.py's imports, module size) are read
here with `ast`.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.repo import REPO

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
SOURCES = [REPO / "tasks.py", *sorted((REPO / "remote").rglob("*.py")), *sorted((REPO / "src").rglob("*.py"))]
MAX_MODULE_LINES = 450


def _module_name(path: Path) -> str:
    relative = path.relative_to(REPO / "src" if path.is_relative_to(REPO / "src") else REPO).with_suffix("")
    parts = list(relative.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(path: Path) -> str:
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": f"{root / 'src'}:{root}", "PATH": "/usr/bin:/bin"})


def test_the_import_contracts_hold() -> None:
    # as the test command runs them: plain `lint-imports`, src/ on the path through the venv (scripts/setup.sh)
    result = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(("module", "violation", "reported"), [
    ("remote/agent.py", "import torch", "remote.agent -> torch"),
    ("remote/agent.py", "from specops.host import gpus", "remote.agent -> specops.host.gpus"),
    ("src/specops/doctor/__init__.py", "import specops.pipeline.run", "specops.doctor -> specops.pipeline.run"),
    ("src/specops/contract/protocol.py", "import remote.agent", "specops.contract.protocol -> remote.agent"),
    ("src/specops/check.py", "from specops.analysis import _index", "specops.check -> specops.analysis._index"),
    ("src/specops/pipeline/training/step.py", "from specops.pipeline.data.heldout import PROMPTS_FILE",
     "specops.pipeline.training.step -> specops.pipeline.data.heldout"),
    # bench/ uses the shared helpers of testing/, never tests/ (tests.support included): a test's refactor must
    # not break a benchmark
    ("bench/reuse.py", "from tests.support.vllm import needs_vllm", "bench.reuse -> tests.support.vllm"),
])
def test_a_deliberate_violation_breaks_a_contract(tmp_path: Path, module: str, violation: str, reported: str) -> None:
    # tests/support/import_contracts.py: the faces contract type pyproject.toml registers
    for part in ("remote", "src", "pyproject.toml", "tasks.py", "tests", "testing", "bench"):
        source = REPO / part
        (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, tmp_path / part)
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{violation}  # deliberate\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout and reported in result.stdout, result.stdout[-3000:]


def test_no_module_imports_another_packages_private_names() -> None:
    offences = []
    for path in SOURCES:
        importer_package = _package_of(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if node.module.split(".")[0] not in {"remote", "specops", "tasks", "tests"}:
                continue
            private = [alias.name for alias in node.names
                       if alias.name.startswith("_") and not alias.name.startswith("__")]
            source_package = node.module if (REPO / "src" / node.module.replace(".", "/")).is_dir() or (
                REPO / node.module.replace(".", "/")).is_dir() else node.module.rpartition(".")[0]
            if private and not (importer_package + ".").startswith(source_package + "."):
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                offences.append(f"{where}: from {node.module} import {', '.join(private)}")
    assert offences == []


def test_tasks_py_is_thin_it_imports_only_invoke_and_remote() -> None:
    tree = ast.parse((REPO / "tasks.py").read_text())
    nodes = list(ast.walk(tree))
    imported = {alias.name.split(".")[0] for node in nodes if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in nodes if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"invoke", "remote", "sys", "pathlib"}


def test_no_module_is_a_warehouse() -> None:
    lines = {str(path.relative_to(REPO)): len(path.read_text().splitlines()) for path in SOURCES}
    too_long = {name: count for name, count in lines.items() if count > MAX_MODULE_LINES}
    assert too_long == {}


def test_no_registry_skips_a_missing_module_silently() -> None:
    for path in (REPO / "tasks.py", REPO / "src" / "specops" / "cli.py"):
        assert "ModuleNotFoundError" not in path.read_text(), path


def test_no_environment_or_third_party_files_are_tracked() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    offending = [path for path in tracked.splitlines()
                 if path.split("/")[0] in {".venv", ".venv-vllm", ".whl", ".tools", ".cache", ".specops"}
                 or path.endswith((".whl", ".deb"))]
    assert offending == []
