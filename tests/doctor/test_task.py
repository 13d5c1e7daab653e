"""`invoke doctor` as a user runs it: the installed stack alone without --run, the run's checks with it."""

from __future__ import annotations

import pytest

from tests.support.cli import Cli

RUN_ROWS = {"flags", "model", "resources"}


@pytest.mark.slow
def test_invoke_doctor_without_run_checks_the_stack_and_with_run_the_run_too(cli: Cli) -> None:
    stack = cli("doctor", "--host", "local", "--json", timeout=300)
    document = stack.json()
    assert document["scope"] == "stack" and "run" not in document, stack.stderr[-2000:]
    assert not RUN_ROWS & {f["check"] for f in document["findings"]}
    assert stack.exit_code == (0 if document["ok"] else 1)

    with_run = cli("doctor", "--host", "local", "--run", "tiny", "--json", timeout=300)
    document = with_run.json()
    assert document["scope"] == "run" and document["run"] == "tiny", with_run.stderr[-2000:]
    assert RUN_ROWS <= {f["check"] for f in document["findings"]}
