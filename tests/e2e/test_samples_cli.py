"""'N samples' through the real `invoke`, on `local` and over the real sshd: the same N rows in every step.

The README's own flow: `invoke extract --samples 10` (one SSH login for the whole task; the job records
the doctor and the synced revision), `invoke validate`, then `invoke train`, then `invoke pipeline
--samples 10`; all of them read the same ten rows (the manifest says which), and a later run with more
samples extends the extraction instead of redoing it. On `local` (the embedded default) the quick first
check, extract and validate, is run; the rest is the same code on either host. One training epoch, short
regenerated answers (32 tokens) and no evaluation (the held-out prompts are still set aside) keep it
quick.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.cli import Cli
from tests.support.repo import REPO
from tests.support.sshd import SshServer

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def _one_epoch_runs(tmp_path: Path) -> dict[str, str]:
    runs = tmp_path / "my-runs"
    runs.mkdir()
    config = yaml.safe_load((REPO / "runs" / "tiny.yaml").read_text())
    config["train"]["epochs"] = 1
    config["regenerate"]["max_tokens"] = 32
    config["evaluate"]["enabled"] = False
    (runs / "tiny.yaml").write_text(yaml.safe_dump(config))
    return {"SPECOPS_RUNS_DIR": str(runs), "SPECOPS_FETCHED": str(tmp_path / "fetched")}


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())["steps"]


def _extract_and_validate_ten(cli: Cli, env: dict[str, str], host_name: str, run_dir: Path,
                              sshd: SshServer) -> dict:
    """`invoke extract --samples 10` then `invoke validate`; the prepare step's counts."""
    before = sshd.logins()
    extracted = cli("extract", "--host", host_name, "--samples", "10", "--json", timeout=600, **env)
    assert extracted.exit_code == 0, extracted.stderr[-3000:]
    assert sshd.logins() - before == (0 if host_name == "local" else 1)  # doctor, launch, follow: one login
    report = extracted.json()
    assert report["ok"] is True and report["backend"] == "hf"
    assert report["counts"]["samples"] == 10
    prepared = _manifest(run_dir)["prepare"]["counts"]
    assert prepared["rows"] == 10 and len(prepared["source_lines"]) == 10  # which rows: lines of the data
    assert sorted(path.name for path in (run_dir / "hidden_states").glob("hs_*.safetensors")) == sorted(
        f"hs_{index}.safetensors" for index in range(10))
    jobs = cli("status", "--host", host_name, "--json", **env).json()["jobs"]
    extract_job = next(job for job in jobs if job["name"] == "extract")
    assert extract_job["state"] == "succeeded" and extract_job["meta"]["doctor"]["ok"] is True
    assert extract_job["revision"]["commit"]  # the synced revision is recorded
    validated = cli("validate", "--host", host_name, "--json", timeout=600, **env)
    assert validated.exit_code == 0, validated.stderr[-3000:]
    checks = validated.json()["checks"]
    assert checks["files"]["ok"] and checks["fidelity"]["ok"]
    assert checks["fidelity"]["detail"]["agreement"] >= 0.98
    return prepared


def test_the_quick_first_check_on_the_embedded_default_extracts_and_validates_ten_rows(
        cli: Cli, tmp_path: Path, sshd: SshServer) -> None:
    # the README's first command on host `local`; what follows it is the same code as over SSH, below
    _extract_and_validate_ten(cli, _one_epoch_runs(tmp_path), "local", tmp_path / "local-workdir" / "runs" / "tiny",
                              sshd)


def test_ten_samples_are_the_same_ten_rows_through_every_step_and_more_samples_extend_the_work(
        cli: Cli, tmp_path: Path, sshd: SshServer) -> None:
    host_name = "loop"
    env = _one_epoch_runs(tmp_path)
    run_dir = tmp_path / "loop-workdir" / "runs" / "tiny"
    prepared = _extract_and_validate_ten(cli, env, host_name, run_dir, sshd)

    trained = cli("train", "--host", host_name, "--skip-doctor", "--json", timeout=900, **env)
    assert trained.exit_code == 0, trained.stderr[-3000:]
    assert trained.json()["status"] == "done"
    assert _manifest(run_dir)["train"]["inputs"]["samples"] == 10

    ten = cli("pipeline", "--host", host_name, "--samples", "10", "--skip-doctor", "--json", timeout=900, **env)
    assert ten.exit_code == 0, ten.stderr[-3000:]
    summary = ten.json()
    assert summary["samples"] == 10
    for step in ("prepare", "extract", "validate", "train"):
        assert summary["steps"][step]["status"] in ("skipped: unchanged", "done"), summary["steps"]
    assert summary["steps"]["extract"]["status"] == "skipped: unchanged"
    assert (tmp_path / "fetched" / host_name / "tiny" / "checkpoint" / "model.safetensors").is_file()

    first_file = run_dir / "hidden_states" / "hs_0.safetensors"
    written_at = first_file.stat().st_mtime_ns
    more = cli("pipeline", "--host", host_name, "--samples", "20", "--skip-doctor", "--no-fetch", "--json",
               timeout=900, **env)
    assert more.exit_code == 0, more.stderr[-3000:]
    assert more.json()["samples"] == 20
    steps = _manifest(run_dir)
    assert steps["extract"]["counts"]["samples"] == 20 and steps["extract"]["counts"]["written"] == 10
    assert steps["prepare"]["counts"]["source_lines"][:10] == prepared["source_lines"]
    assert steps["train"]["inputs"]["samples"] == 20
    assert first_file.stat().st_mtime_ns == written_at  # rows 0..9 were kept, not redone
