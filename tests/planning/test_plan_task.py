"""`invoke plan` as a user runs it, on the tiny run: on this machine and over the loopback sshd, each host
reading its own GPUs and disk; and the launch boundary refusing a hidden-state mode that cannot fit
(one line, exit 2, no job started)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.cli import Cli
from tests.support.repo import REPO


def _runs(tmp_path: Path, **variants: dict) -> Path:
    """A runs folder (SPECOPS_RUNS_DIR) with runs/tiny.yaml changed by each variant, under its name."""
    folder = tmp_path / "my-runs"
    folder.mkdir()
    tiny = yaml.safe_load((REPO / "runs" / "tiny.yaml").read_text())
    for name, changes in variants.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump({**tiny, **changes}))
    return folder


@pytest.mark.slow
def test_plan_on_the_tiny_run_here_and_over_ssh(cli: Cli) -> None:
    result = cli("plan", "--hosts", "local,loop", "--json", timeout=600)
    assert result.exit_code == 0, result.stderr[-3000:]
    rows = {row["host"]: row["document"] for row in result.json()["hosts"]}
    assert set(rows) == {"local", "loop"}
    for plan in rows.values():
        assert plan["ok"] and plan["mode"] == "offline" and plan["recommended"]["mode"] == "offline"
        assert plan["host_facts"]["source"] == "measured" and plan["host_facts"]["disk_free_bytes"] > 0
        states = plan["hidden_states"]
        # a CPU host computes the "auto" target in float32: 4 layers x 64 x 4 bytes a token
        assert (states["dtype"], states["bytes_per_token"], states["file_bytes_per_token"]) == ("float32", 1024, 1032)
        assert plan["data"]["tokens_source"].startswith("estimated: the first 32 conversations")
        # what the draft learns from: each row's answer (the tiny run regenerates 128-token answers)
        data = plan["data"]
        assert 0 < data["loss_tokens"] <= 128 * data["samples"] and data["loss_tokens"] < data["tokens"]
        assert "answer tokens each on average" in data["loss_tokens_source"]
        assert plan["target"]["weight_source"] == "safetensors headers"
        assert plan["target"]["weight_dtypes"] == {"F32": plan["target"]["weight_bytes"]}
        assert plan["modes"]["online"]["placement"]["kind"] == "cpu"  # no GPU: server and trainer share the CPU
    # both hosts hold the same generated target and data: the same figures, read on each
    assert rows["local"]["hidden_states"] == rows["loop"]["hidden_states"]

    shown = cli("plan", "--host", "loop", timeout=600)
    assert shown.exit_code == 0, shown.stderr[-3000:]
    assert "plan — run tiny on loop" in shown.stdout and "recommended: offline" in shown.stdout
    assert "the run's mode offline fits" in shown.stdout
    assert "what the draft learns from" in shown.stdout


def test_the_plan_counts_the_loss_tokens_of_prepared_rows(finished) -> None:
    import json

    from tests.support.agent import run_agent

    code, plan, stderr = run_agent(finished[0], "plan", "--run", "tiny")
    assert code == 0, stderr[-3000:]
    counts = json.loads((finished[0] / "runs" / "tiny" / "manifest.json").read_text())["steps"]["prepare"]["counts"]
    assert (plan["data"]["loss_tokens"], plan["data"]["tokens"]) == (counts["loss_tokens"], counts["tokens"])
    assert plan["data"]["loss_tokens_source"] == f"counted: the {counts['rows']} prepared rows"


@pytest.mark.slow
def test_a_mode_that_cannot_fit_is_refused_before_any_job_starts(cli: Cli, tmp_path: Path) -> None:
    runs = _runs(tmp_path, budget={"hidden_states": {"mode": "offline", "disk_budget_gb": 0.001}},
                 gpus={"plan": {"gpus": 8, "gpu_memory_gib": 0.001}})
    env = {"SPECOPS_RUNS_DIR": str(runs)}

    over_budget = cli("pipeline", "--host", "local", "--run", "budget", "--detach", timeout=600, **env)
    assert over_budget.exit_code == 2, over_budget.stderr[-3000:]
    line = over_budget.stderr.strip()
    assert "\n" not in line and line.startswith(f"specops: {runs / 'budget.yaml'}: hidden_states.mode: offline "
                                                "does not fit this host: offline writes ")
    assert "over the disk budget of 1.00 MB" in line

    tiny_gpus = cli("extract", "--host", "local", "--run", "gpus", "--detach", timeout=600, **env)
    assert tiny_gpus.exit_code == 2, tiny_gpus.stderr[-3000:]
    assert "hidden_states.mode: offline does not fit this host: the server needs" in tiny_gpus.stderr
    assert "of 0.0 GiB" in tiny_gpus.stderr

    status = cli("status", "--host", "local", "--all", "--json", timeout=120)
    assert status.exit_code == 0 and status.json()["jobs"] == []  # nothing was launched

    planned = cli("plan", "--host", "local", "--run", "budget", "--json", timeout=600, **env)
    assert planned.exit_code == 1  # the plan itself reports, it does not refuse
    document = planned.json()
    assert not document["ok"] and document["problems"][0].startswith("offline writes ")
    assert document["modes"]["offline"]["budget_bytes"] == 10**6


def test_plan_of_a_kimi_shaped_target_from_its_config_files_alone(cli: Cli, tmp_path: Path) -> None:
    kimi = {"model": str(Path(__file__).parent / "kimi-k2.5"), "trust_remote_code": True, "data": "data/chat.jsonl",
            "samples": 10_000, "max_seq_len": 2_000, "backend": "vllm", "train": {"epochs": 10},
            "draft": {"vocab_size": 32000},
            "plan": {"gpus": 8, "gpu_memory_gib": 141, "disk_free_gb": 3000, "extract_tokens_per_s": 20_000,
                     "train_tokens_per_s": 40_000}}
    runs = tmp_path / "kimi-runs"
    runs.mkdir()
    (runs / "kimi.yaml").write_text(yaml.safe_dump(kimi))
    result = cli("plan", "--host", "local", "--run", "kimi", "--json", timeout=300, SPECOPS_RUNS_DIR=str(runs))
    assert result.exit_code == 0, result.stderr[-3000:]
    plan = result.json()
    assert plan["host_facts"]["source"].endswith("plan: gpus, gpu_memory_gib, disk_free_gb; the rest measured")
    # no tokenizer beside the config: at most 10,000 rows x 2,000 tokens
    assert plan["data"]["tokens"] == 20_000_000 and plan["data"]["tokens_source"].startswith("upper bound")
    assert plan["hidden_states"]["layer_ids"] == [2, 30, 58, 61]  # vLLM serving's ids for 61 layers
    states = plan["hidden_states"]
    assert states["bytes_per_token"] == 57_344 and states["bytes_total"] == 1_146_880_000_000
    assert plan["target"]["weight_bytes"] == 594_205_305_856 and plan["server"]["kv_bytes_per_token"] == 70_272
    assert (plan["server"]["tensor_parallel"], plan["trainer"]["draft_params"]) == (8, 2_543_378_432)
    assert plan["recommended"]["mode"] == "offline"
    assert plan["modes"]["offline"]["total_s"] == 20_000_000 / 20_000 + 10 * 20_000_000 / 40_000


def _nothing_large(workdir: Path) -> None:
    """The host's workdir holds the synced agent and small records: no model, no file of 1 MB or more."""
    largest = max((path.stat().st_size for path in workdir.rglob("*") if path.is_file()), default=0)
    assert largest < 1024 * 1024 and not (workdir / "models").exists()


def _kimi_runs(tmp_path: Path, **changes: object) -> Path:
    """runs/kimi-k25.yaml as shipped, `changes` applied (top-level keys; hidden_states merged), in a runs folder."""
    shipped = yaml.safe_load((REPO / "runs" / "kimi-k25.yaml").read_text())
    states = {**shipped["hidden_states"], **changes.pop("hidden_states", {})}  # type: ignore[dict-item]
    folder = tmp_path / "kimi-runs"
    folder.mkdir(exist_ok=True)
    (folder / "kimi-k25.yaml").write_text(yaml.safe_dump({**shipped, **changes, "hidden_states": states}))
    return folder


def test_the_plan_table_names_every_backend_and_what_fits_instead(cli: Cli, tmp_path: Path) -> None:
    """The shipped Kimi-K2.5 run (its config.json alone, in tests/planning/kimi-k2.5) at issue 40's 20,000 rows,
    as written with the file backend: no row fits; the table gives every backend x mode and the nearest that fit."""
    runs = _kimi_runs(tmp_path, model=str(Path(__file__).parent / "kimi-k2.5"), samples=20_000,
                      hidden_states={"backend": "file"})
    shown = cli("plan", "--host", "local", "--run", "kimi-k25", timeout=300, SPECOPS_RUNS_DIR=str(runs))
    assert shown.exit_code == 1, shown.stderr[-3000:]  # the run's mode does not fit: a plan all the same
    text = shown.stdout
    rows = text[text.index("hidden-state backends x modes"):text.index("what fits instead of file offline")]
    for backend, mode, disk in (("file", "offline (the run's)", "4.72 TB"), ("fp8", "offline", "2.38 TB"),
                                ("mooncake", "online", "")):
        cells = [[cell.strip() for cell in line.split("│")[1:]] for line in rows.splitlines()]
        assert any(row[:2] == [backend, mode] and disk in row[3] for row in cells), (backend, mode, rows)
    assert "keeps no files" in rows and "the server needs 73.4 GiB per" in rows
    alternatives = text[text.index("what fits instead of file offline"):text.index("model loads:")]
    fp8_rows = [line for line in alternatives.splitlines() if line.startswith("│ fp8 ")]
    assert any("401 of 20,000" in line and "71.94 GB" in line for line in fp8_rows), alternatives
    assert "the most rows that fit: 401 of" in alternatives and "1 more host (train role)" in alternatives
    assert "50 more host(s)" in alternatives  # fp8 split over 51 hosts
    recommended = next(line for line in text.splitlines() if line.startswith("recommended:"))
    assert recommended.startswith("recommended: none as written; nearest fp8 offline with 401 of 20,000 rows — "
                                  "disk 71.94 GB, 1 server load, time unknown")
    assert "as written: no mode fits this host" in recommended

    planned = cli("plan", "--host", "local", "--run", "kimi-k25", "--json", timeout=300, SPECOPS_RUNS_DIR=str(runs))
    document = planned.json()  # the JSON keeps its keys; rows and alternatives are the table's source
    assert planned.exit_code == 1 and {"modes", "recommended", "rows", "alternatives", "loads"} <= set(document)
    assert document["recommended"]["nearest"]["samples"] == 401
    # planned from config.json alone: nothing generated, loaded or written beyond the synced agent and records
    _nothing_large(tmp_path / "local-workdir")


def test_the_shipped_kimi_run_fits_its_plan_host(cli: Cli, tmp_path: Path) -> None:
    """runs/kimi-k25.yaml as shipped (fp8 offline, its samples) fits the host its plan: names."""
    runs = _kimi_runs(tmp_path, model=str(Path(__file__).parent / "kimi-k2.5"))
    planned = cli("plan", "--host", "local", "--run", "kimi-k25", "--json", timeout=300, SPECOPS_RUNS_DIR=str(runs))
    assert planned.exit_code == 0, planned.stdout[-3000:]
    document = planned.json()
    assert (document["backend"], document["mode"], document["recommended"]["mode"]) == ("fp8", "offline", "offline")
    assert document["alternatives"] == []


@pytest.mark.skipif(Path("/models/Kimi-K2.5/config.json").exists(), reason="the checkpoint is on this machine")
def test_a_checkpoint_not_on_the_host_is_one_line(cli: Cli, tmp_path: Path) -> None:
    """`invoke plan --run kimi-k25` where /models/Kimi-K2.5 is absent: one line naming the key and the file, exit 2,
    nothing written."""
    runs = _kimi_runs(tmp_path)
    for extra in ((), ("--json",)):
        result = cli("plan", "--host", "local", "--run", "kimi-k25", *extra, timeout=300, SPECOPS_RUNS_DIR=str(runs))
        assert result.exit_code == 2, result.stderr[-3000:]
        line = result.stderr.strip()
        assert "\n" not in line and line.startswith(f"specops: {runs / 'kimi-k25.yaml'}: model: "
                                                    "/models/Kimi-K2.5/config.json not found")
    _nothing_large(tmp_path / "local-workdir")


def test_a_role_split_plans_each_hosts_part(cli: Cli, tmp_path: Path) -> None:
    """Issue 40's Kimi-K2.5 run online at 20,000 rows: no one host fits it (the server beside the trainer needs
    73.4 GiB a GPU). Planned as a role split, each host plans its own part: the serve host the server on all 8
    GPUs at tensor parallel 8, the train host the trainer, the prepared rows and the checkpoints; both fit."""
    runs = _kimi_runs(tmp_path, model=str(Path(__file__).parent / "kimi-k2.5"), samples=20_000,
                      hidden_states={"mode": "online", "backend": "file"})
    alone = cli("plan", "--host", "local", "--run", "kimi-k25", "--json", timeout=300, SPECOPS_RUNS_DIR=str(runs))
    assert alone.exit_code == 1 and not alone.json()["modes"]["online"]["fits"]

    split = cli("plan", "--hosts", "serve=local;train=loop", "--run", "kimi-k25", "--json", timeout=300,
                SPECOPS_RUNS_DIR=str(runs))
    assert split.exit_code == 0, split.stdout[-3000:] + split.stderr[-3000:]
    parts = {row["host"]: row["document"]["role"] for row in split.json()["hosts"]}
    serve, train = parts["local"], parts["loop"]
    assert (serve["role"], serve["fits"], serve["server"]["tensor_parallel"]) == ("serve", True, 8)
    assert serve["server"]["kv_tokens"] >= 2_000  # one whole sequence beside the weights on every GPU
    assert (train["role"], train["fits"], train["problems"]) == ("train", True, [])
    assert train["trainer_bytes"] < 95.6 * 2**30 and train["disk_bytes"] > 0

    shown = cli("plan", "--hosts", "serve=local;train=loop", "--run", "kimi-k25", timeout=300,
                SPECOPS_RUNS_DIR=str(runs))
    assert shown.exit_code == 0, shown.stderr[-3000:]
    assert "serve: the run's vLLM server, every GPU of the host: fits" in shown.stdout
    assert "train: speculators' trainer, every GPU of the host: fits" in shown.stdout
