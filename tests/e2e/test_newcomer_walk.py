"""A newcomer's walk (issue 46): after the demo, the README's everyday commands on the `local` host in the
documented order, each with its exit code, and the trained draft still fetchable at the end.

On a copy of the shared finished run (tests/support/finished.py): every step skips, so the walk costs the
tasks' own overhead. `invoke extract --samples 10` (fewer rows than the draft trained on) keeps the draft; a
checkpoint that does not exist is exit 2 with no job started; status shows no internal markers; rows that
would drop the draft are refused naming --retire, and with it the draft is set aside and `invoke restore`
brings it back.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.agent import PYTHON
from tests.support.cli import Cli, write_inventory
from tests.support.finished import copy_of

pytestmark = pytest.mark.slow


def test_the_readme_walk_after_the_demo_keeps_the_trained_draft(finished: tuple[Path, dict], tmp_path: Path) -> None:
    workdir = copy_of(finished, tmp_path / "local-workdir")
    inventory = write_inventory(tmp_path / "inventory.yaml",
                                {"local": {"connection": "local", "workdir": str(workdir), "python": PYTHON}},
                                default="local")
    cli = Cli(inventory, tmp_path / "logs")
    fetched = tmp_path / "fetched"
    env = {"SPECOPS_FETCHED": str(fetched)}
    run_dir = workdir / "runs" / "tiny"

    def jobs() -> int:
        return len(list((workdir / "state" / "jobs").glob("*.json"))) if (workdir / "state" / "jobs").is_dir() else 0

    walk = [  # (the README's command, its exit code)
        (["hosts"], 0),
        (["status"], 0),
        (["plan"], 0),
        (["extract", "--samples", "10", "--skip-doctor"], 0),
        (["validate"], 0),
        (["evaluate"], 0),
        (["status"], 0),
        (["fetch"], 0),
    ]
    for args, code in walk:
        result = cli(*args, timeout=600, **env)
        assert result.exit_code == code, f"invoke {' '.join(args)}: {result.exit_code}\n{result.stderr[-3000:]}"
        assert "### specops" not in result.stdout, result.stdout
        if args[0] == "extract":
            assert "retired" not in result.stderr and (run_dir / "checkpoints").is_dir(), result.stderr[-2000:]
        if args[0] == "validate":
            assert "validate: OK" in result.stdout, result.stdout

    before = jobs()
    result = cli("evaluate", "--checkpoint", "99", **env)
    assert result.exit_code == 2 and "epoch 99" in result.stderr, result.stderr
    assert jobs() == before  # refused before launch: no job

    result = cli("prepare", "--samples", "10", **env)
    assert result.exit_code == 2 and "--retire" in result.stderr, result.stderr
    assert jobs() == before and (run_dir / "checkpoints").is_dir()

    # --retire: said and undone (invoke restore), and the draft is fetchable again
    result = cli("prepare", "--samples", "10", "--retire", timeout=600, **env)
    assert result.exit_code == 0 and "invoke restore --run tiny" in result.stderr, result.stderr[-3000:]
    assert cli("fetch", **env).exit_code == 2  # nothing trained in place now: one line, exit 2
    result = cli("restore", **env)
    assert result.exit_code == 0 and "restored" in result.stdout, result.stderr[-3000:]
    shutil.rmtree(fetched)
    assert cli("fetch", **env).exit_code == 0
    assert (fetched / "local" / "tiny" / "checkpoint" / "model.safetensors").is_file()
