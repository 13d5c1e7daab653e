"""The agent's command registry: explicit, lazy, and loud when an entry is wrong."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specops import cli
from specops.contract.errors import BadInput
from tests.support.agent import SRC


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_registered_command_loads_and_registers_its_parser(command: str) -> None:
    parser = cli.build_parser(command)
    try:
        parser.parse_known_args([command])
    except BadInput as exc:  # a required argument may be missing; the command itself must be known
        assert "invalid choice" not in str(exc)


def test_an_unknown_command_names_every_valid_one(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["no-such-command"])
    document = json.loads(capsys.readouterr().out)
    assert code == 2 and "invalid choice: 'no-such-command'" in document["error"]
    assert all(f"'{name}'" in document["error"] for name in cli.COMMANDS)


def test_a_wrong_import_in_the_registry_fails_loudly(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    def misspelt() -> tuple:
        from specops.pipeline import no_such_module  # type: ignore[attr-defined]  # noqa: F401

        return ()

    monkeypatch.setitem(cli.COMMANDS, "tiny", misspelt)
    code = cli.main(["tiny"])
    document = json.loads(capsys.readouterr().out)
    assert code == 1 and "no_such_module" in document["error"]


def test_a_command_imports_only_its_own_modules() -> None:
    probe = ("import sys; from specops.cli import main; main(['ping']); "
             "import json; print(json.dumps(sorted(m for m in sys.modules if m.startswith('specops.'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    ping, loaded = done.stdout.strip().splitlines()
    assert json.loads(ping)["ok"] is True
    assert not [m for m in json.loads(loaded) if m.startswith(("specops.pipeline", "specops.doctor", "specops.patching",
                                                           "specops.jobs"))]
