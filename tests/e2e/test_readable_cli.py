"""Output a person reads, through the real `invoke`: no raw JSON in human output, training as one
progress bar per epoch (the raw trainer log stays in the job's log), the data's malformed rows as a
count and where the full list is (once per change of the data), and doctor rows that say how to fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.cli import Cli
from tests.support.repo import REPO

pytestmark = [pytest.mark.slow]


def _json_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip().startswith("{") and line.strip().endswith("}")]


def test_steps_read_as_text_training_as_a_bar_per_epoch_and_malformed_rows_as_a_count(
        cli: Cli, tmp_path: Path) -> None:
    runs = tmp_path / "my-runs"
    runs.mkdir()
    config = yaml.safe_load((REPO / "runs" / "tiny.yaml").read_text())
    config["train"]["epochs"] = 2
    config["regenerate"]["max_tokens"] = 32  # short answers: what is read is the output, not the answers
    (runs / "tiny.yaml").write_text(yaml.safe_dump(config))
    env = {"SPECOPS_RUNS_DIR": str(runs)}

    extracted = cli("extract", "--host", "local", "--samples", "10", "--skip-doctor", timeout=600, **env)
    assert extracted.exit_code == 0, extracted.stderr[-3000:]
    said = extracted.stdout + extracted.stderr
    assert "not valid JSON (" not in said  # the rows themselves are in the report, not on the screen
    (count_line,) = [line for line in said.splitlines() if "malformed" in line]
    assert "the full list is in" in count_line and "prepare_report.json" in count_line
    for samples in ("12", "10"):  # other rows of the same data: not said again
        again = cli("prepare", "--host", "local", "--samples", samples, **env)
        assert again.exit_code == 0 and "malformed" not in again.stdout + again.stderr, again.stderr

    trained = cli("train", "--host", "local", "--skip-doctor", timeout=900, **env)
    assert trained.exit_code == 0, trained.stderr[-3000:]
    shown = trained.stdout + trained.stderr
    assert "train/loss_0=" not in shown and " INFO " not in shown  # speculators' raw records are not shown
    bars = [line for line in shown.splitlines() if line.startswith("epoch ")]
    assert [line.split()[1] for line in bars] == ["1/2", "2/2"], shown[-3000:]
    for bar in bars:
        assert "loss " in bar and "acc@0 " in bar and "tokens/s" in bar and "ETA" in bar
    assert not _json_lines(shown)
    log = cli("logs", "--host", "local", "--job", "train", "--lines", "400")
    assert "train/loss_0=" in log.stdout + log.stderr  # ...the job's log keeps them

    pipeline = cli("pipeline", "--host", "local", "--samples", "10", "--skip-doctor", "--no-fetch", timeout=900,
                   **env)
    assert pipeline.exit_code == 0, pipeline.stderr[-3000:]
    assert not _json_lines(pipeline.stdout + pipeline.stderr)
    assert "pipeline — run tiny on local" in pipeline.stdout


def test_every_doctor_row_that_is_not_ok_says_how_to_fix_it(cli: Cli) -> None:
    result = cli("doctor", "--host", "local", "--run", "tiny", "--json", timeout=300)
    findings = result.json()["findings"]
    unknown = [finding for finding in findings if finding["result"] == "unknown"]
    assert unknown  # the static check cannot judge everything on this stack
    assert [finding for finding in findings if finding["result"] != "ok" and not finding["fix"]] == []


def test_patch_verify_counts_what_it_could_not_resolve_and_lists_it_only_when_asked(cli: Cli) -> None:
    import re

    args = ("patch", "verify", "--host", "local", "--set", "speculators-0.9.0-cpu")
    plain = cli(*args, timeout=300)
    assert plain.exit_code == 0, plain.stdout + plain.stderr
    counts = re.findall(r"calls_bind\s*│\s*ok\s*│\s*(\d+) bound, (\d+) not resolved", plain.stdout)
    assert counts, plain.stdout
    assert "could not resolve" not in plain.stdout and "may change its signature" not in plain.stdout
    verbose = cli(*args, "--verbose", timeout=300)
    assert "may change its signature" in verbose.stdout or "could not resolve" in verbose.stdout
    checks = [check for check in cli(*args, "--json", timeout=300).json()["checks"] if check["check"] == "calls_bind"]
    for check, (bound, unresolved) in zip(checks, counts, strict=True):  # --json keeps every finding
        statuses = [finding["status"] for finding in check["findings"]]
        assert statuses.count("unknown") == int(unresolved) and statuses.count("ok") == int(bound)
