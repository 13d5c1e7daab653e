"""One SSH connection per task: `invoke extract` (doctor, launch, follow) and `invoke pipeline`
(doctor, launch, follow, fetch) each log in to the real sshd exactly once, counted in its log."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import Cli
from tests.support.sshd import SshServer

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def test_extract_over_ssh_opens_one_connection(cli: Cli, sshd: SshServer, tmp_path: Path) -> None:
    before = sshd.logins()
    extracted = cli("extract", "--host", "loop", "--samples", "4", "--json", timeout=600)
    assert extracted.exit_code == 0, extracted.stderr[-3000:]
    assert extracted.json()["counts"]["samples"] == 4
    assert sshd.logins() - before == 1


def test_pipeline_over_ssh_opens_one_connection_including_the_fetch(cli: Cli, sshd: SshServer,
                                                                     tmp_path: Path) -> None:
    fetched = tmp_path / "fetched"
    before = sshd.logins()
    result = cli("pipeline", "--host", "loop", "--json", timeout=900, SPECOPS_FETCHED=str(fetched))
    assert result.exit_code == 0, result.stderr[-4000:]
    assert result.json()["fetched"] == str(fetched / "loop" / "tiny")
    assert (fetched / "loop" / "tiny" / "checkpoint" / "model.safetensors").is_file()
    assert sshd.logins() - before == 1
