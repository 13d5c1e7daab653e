"""The tiny run with `backend: vllm`, the whole pipeline: server loads counted, shown and never wasted.

One `pipeline` on the real vLLM CPU build, regenerate and evaluate on (issue 34: it used to start six
servers). What the module holds to:

- regenerate and extract share one server (the extraction server answers regenerate's chat requests);
  the parity gate's served check is a load of its own, the trained draft's evaluation another: at most
  three starts, read from the job records, and the pipeline's summary counts the same;
- the run's last server is stopped with its last step (vllm.keep_server is false);
- the evaluation still reports a speedup, its baseline measured on the extraction server during extract;
- the hidden-state files equal, byte for byte, those of a server that served nothing before them;
- regenerate's own captures are gone from the staging folder;
- the job log shows the load's progress from vLLM's own log, with the seconds elapsed;
- without regenerate, extract's server is launched before prepare and loads while prepare and vocab run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.support.agent import REPO, run_agent
from tests.support.vllm import tiny_workdir
from tests.vllm.conftest import VLLM_PYTHON, free_port, in_vllm_worker, needs_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm, in_vllm_worker]

RUN = "served"
ENV = {"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON), "VLLM_CPU_KVCACHE_SPACE": "1"}
PIPELINE_TIMEOUT_S = 2400


def _records(workdir: Path) -> list[dict]:
    jobs = workdir / "state" / "jobs"
    found = [json.loads(path.read_text()) for path in sorted(jobs.glob("*.json"))] if jobs.is_dir() else []
    return [record for record in found if record["name"] == "vllm-server" and record["run"] == RUN]


def _digests(folder: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.glob("hs_*"))}


@pytest.fixture(scope="module")
def piped(patched_vllm, tmp_path_factory) -> dict:
    root = tiny_workdir(tmp_path_factory.mktemp("loads") / "w", free_port())
    os.symlink(REPO / "patches", root / "patches")
    config = yaml.safe_load((REPO / "runs" / "tiny.yaml").read_text())
    config.update(backend="vllm", samples=48)
    config["vllm"]["port"] = free_port()
    config["train"]["epochs"] = 2
    config["evaluate"].update(heldout_prompts=8, max_tokens=32)
    # one prompt at a time: under load the server batches 8 in flight as they arrive, and a file's last bits
    # follow its batch (one of 48 differed from the dedicated server's on a busy 2-core machine)
    config.setdefault("hidden_states", {})["concurrency"] = 1
    (root / "runs" / f"{RUN}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    code, summary, stderr = run_agent(root, "pipeline", "--run", RUN, env=ENV, timeout=PIPELINE_TIMEOUT_S)
    assert code == 0, json.dumps(summary)[:3000] + stderr[-6000:]
    return {"root": root, "summary": summary, "stderr": stderr}


def test_at_most_three_server_starts_counted_in_the_summary(piped) -> None:
    records = _records(piped["root"])
    servers = piped["summary"]["servers"]
    assert len(records) <= 3, [record["meta"].get("serves") for record in records]
    assert servers["starts"] == len(records)
    assert [load["job"] for load in servers["loads"]] == [record["id"] for record in records]
    assert servers["seconds_loading"] > 0
    serves = [record["meta"]["serves"] for record in records]
    assert serves[0] == "the target, capturing hidden states"  # regenerate's, reused by extract
    assert "extract: reusing vLLM server job" in piped["stderr"]


def test_the_last_server_is_stopped_with_the_last_step(piped) -> None:
    assert all(record["state"] not in ("pending", "running") for record in _records(piped["root"]))
    assert piped["summary"]["servers"]["stopped"] and not piped["summary"]["servers"]["kept"]


def test_the_evaluation_reports_a_speedup_against_the_extraction_servers_target_alone(piped) -> None:
    report = piped["summary"]["evaluation"]["report"]
    assert report["backend"] == "vllm" and report["speedup"] is not None
    assert report["tokens_per_s_base"] and "extraction server" in report["speedup_baseline"]["how"]
    untrained = piped["summary"]["evaluation"]["untrained"]
    assert untrained["backend"] == "hf" and "replay" in untrained["scored_by"]


def test_regenerates_captures_are_discarded(piped) -> None:
    staging = piped["root"] / "runs" / RUN / "vllm_staging"
    assert not list(staging.glob("*.safetensors")) and not list(staging.glob("*.lock"))


def test_the_job_log_shows_the_loads_progress(piped) -> None:
    lines = [line for line in piped["stderr"].splitlines() if line.startswith("vllm: ")]
    assert any(line.startswith("vllm: loading, ") and "weights read" in line for line in lines), lines[:20]
    assert any(line.startswith("vllm: ready in ") for line in lines)


def test_the_shared_servers_files_equal_a_dedicated_servers(piped, tmp_path) -> None:
    copy = tmp_path / "w"
    # not tmp/: the stopped servers' zmq sockets lie there
    shutil.copytree(piped["root"], copy, symlinks=True, ignore=shutil.ignore_patterns("tmp"))
    folder = copy / "runs" / RUN / "hidden_states"
    shared = _digests(folder)
    assert len(shared) == 48
    for path in folder.glob("hs_*"):
        path.unlink()
    # extracting again retires the run's trained draft: said with --retire, as a user must
    code, document, stderr = run_agent(copy, "step", "extract", "--run", RUN, "--stop-server", "--retire", env=ENV,
                                       timeout=PIPELINE_TIMEOUT_S)
    assert code == 0, json.dumps(document)[:3000] + stderr[-4000:]
    assert document["server"]["reused"] is False  # a server of its own that served nothing before
    assert _digests(folder) == shared


def test_without_regenerate_extracts_server_loads_while_prepare_runs(patched_vllm, tmp_path) -> None:
    root = tiny_workdir(tmp_path / "w", free_port())
    os.symlink(REPO / "patches", root / "patches")
    config = yaml.safe_load((REPO / "runs" / "tiny.yaml").read_text())
    config.update(backend="vllm", samples=12)
    config["vllm"]["port"] = free_port()
    config["train"]["epochs"] = 1
    config["regenerate"]["enabled"] = False
    config["evaluate"].update(enabled=False, heldout_prompts=0)
    config["parity"] = {"serve": False}
    (root / "runs" / f"{RUN}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    code, summary, stderr = run_agent(root, "pipeline", "--run", RUN, env=ENV, timeout=PIPELINE_TIMEOUT_S)
    assert code == 0, json.dumps(summary)[:3000] + stderr[-6000:]
    assert stderr.index("== prepare") < stderr.index("ahead of extract") < stderr.index("prepare: done") \
        < stderr.index("== extract")
    # vocab reads only the prepared data: it runs while the server loads, before extract waits for the rest
    assert stderr.index("prepare: done") < stderr.index("== vocab") < stderr.index("vocab: done") \
        < stderr.index("== extract")
    assert "extract: reusing vLLM server job" in stderr[stderr.index("== extract"):]
    assert summary["servers"]["starts"] == 1 and summary["servers"]["loads"][0]["ready_s"] > 0
