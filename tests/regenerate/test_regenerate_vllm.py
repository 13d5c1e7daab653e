"""Regenerate with the vllm backend: speculators' own `regenerate-responses` against the run's real vLLM
CPU server (a `vllm-server` job); a kill -9 of the step and its client mid-way, then a rerun, gives
the same rows as an uninterrupted run, none twice.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.agent import agent_env
from tests.support.runs import edit_run
from tests.vllm.conftest import REPO, VLLM_PYTHON, agent, free_port, in_vllm_worker, needs_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm, in_vllm_worker]

DATA_LINES = 120  # of the tiny dataset's 300: 20 prompts held out, about 100 conversations answered
KILL_AT = 40  # answers written before the kill


def _env(root: Path) -> dict[str, str]:
    return {**agent_env(root), "SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON)}


def _regenerate(root: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specops", "step", "regenerate", "--run", "tiny"], cwd=root,
                            env=_env(root), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _finish(process: subprocess.Popen) -> tuple[int, dict, str]:
    out, err = process.communicate(timeout=1200)
    return process.returncode, json.loads(out.decode().strip().splitlines()[-1]), err.decode()


def _rows(root: Path) -> list[dict]:
    text = (root / "runs" / "tiny" / "regenerated" / "responses.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def vllm_regen_workdir(patched_vllm, tmp_path_factory) -> Path:
    from specops.pipeline.data import tiny

    root = tmp_path_factory.mktemp("vllm-regen") / "w"
    root.mkdir()
    shutil.copytree(REPO / "runs", root / "runs")
    # one server for every step of the module: reuse between steps run by hand is the run config's to ask
    edit_run(root / "runs" / "tiny.yaml", backend="vllm", vllm={"port": free_port(), "keep_server": True},
             regenerate={"max_tokens": 24, "concurrency": 8})
    tiny.generate(root)
    data = root / tiny.DATA_FILE  # a shorter dataset: the resume is what counts here, not the volume
    data.write_text("".join(data.read_text().splitlines(keepends=True)[:DATA_LINES]))
    yield root
    os.environ["SPECOPS_WORKDIR"] = str(root)
    code, stopped, _ = agent(root, "job", "stop", "vllm-server", "--run", "tiny")
    assert code == 0, stopped


def test_five_samples_ask_the_server_only_the_first_conversations(vllm_regen_workdir: Path) -> None:
    from specops.pipeline.run import Manifest

    root = vllm_regen_workdir
    code, prepared, stderr = agent(root, "step", "prepare", "--run", "tiny", "--samples", "5", timeout=900,
                                   env={"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON)})
    assert code == 0 and prepared["counts"]["rows"] == 5, stderr[-4000:]
    counts = Manifest(root / "runs" / "tiny").record("regenerate")["counts"]
    source = (root / "runs" / "tiny" / "regenerated" / "source.jsonl").read_text().splitlines()
    assert 5 <= counts["answered"] < len(source) and counts["complete"] is False and counts["missing"] == 0
    asked = {json.loads(line)["id"] for line in source[:counts["answered"]]}
    assert {row["primary_id"] for row in _rows(root)} <= asked  # speculators' client saw the first ones only
    shutil.rmtree(root / "runs" / "tiny")  # the tests below start from nothing (the server job lives on)


def test_a_killed_vllm_regenerate_resumes_to_the_same_rows_none_twice(vllm_regen_workdir: Path) -> None:
    root = vllm_regen_workdir
    responses = root / "runs" / "tiny" / "regenerated" / "responses.jsonl"
    process = _regenerate(root)
    deadline = time.monotonic() + 900
    while not (responses.is_file() and responses.read_text().count("\n") >= KILL_AT):
        assert process.poll() is None, process.stderr.read().decode()[-4000:]
        assert time.monotonic() < deadline, "speculators wrote nothing in time"
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)  # the step and speculators' client, mid-write; the server job lives on
    process.wait(timeout=30)
    written = responses.read_text().count("\n")
    conversations = len((root / "runs" / "tiny" / "regenerated" / "source.jsonl").read_text().splitlines())
    assert conversations >= 90 and KILL_AT <= written

    code, resumed, stderr = _finish(_regenerate(root))
    assert code == 0, stderr[-4000:]
    assert "reusing vLLM server job" in stderr and "--resume" in resumed["command"]
    rows = _rows(root)
    ids = [row["id"] for row in rows]
    counts = resumed["counts"]
    assert len(ids) == len(set(ids)) == counts["rows"]  # none twice
    assert written < counts["rows"]  # the kill came mid-way
    # every conversation once: answered (one answer each at 24 tokens), or failed and listed with its error
    assert counts["conversations"] + counts["failed"] == conversations and counts["missing"] == 0, resumed["failed"]
    failed = {failure["id"] for failure in resumed["failed"]}
    assert len(failed) == counts["failed"] and all(failure["error"] for failure in resumed["failed"])
    assert not failed & {row["primary_id"] for row in rows}
    assert counts["conversations"] >= conversations - 5
    assert all(row["metadata"]["endpoint"].endswith("/v1/chat/completions") for row in rows)
    # shown while the client ran, counted from its outfile: the conversations this run asked (those the kill left
    # unanswered), from none to all of them
    shown = [match for line in stderr.splitlines()
             if (match := re.match(r"regenerate: (\d+)/(\d+) conversations, (\d+) answers, .* answers/s, ETA ", line))]
    assert shown[0].group(1) == "0" and shown[-1].group(1) == shown[-1].group(2), stderr[-3000:]
    assert conversations - written <= int(shown[-1].group(2)) < conversations

    # an uninterrupted run of the same inputs on the same server
    shutil.rmtree(root / "runs" / "tiny" / "regenerated")
    (root / "runs" / "tiny" / "manifest.json").unlink()
    code, whole, stderr = _finish(_regenerate(root))
    assert code == 0, stderr[-4000:]
    again = _rows(root)
    assert {row["id"]: row["input_ids"] for row in again} == {row["id"]: row["input_ids"] for row in rows}
    assert {failure["id"] for failure in whole["failed"]} == failed
    assert whole["server"]["reused"] is True

    # the hf backend writes the same rows: the same prompt and answer tokens, the same failures
    (root / "runs" / "tiny" / "manifest.json").unlink()
    shutil.rmtree(root / "runs" / "tiny" / "regenerated")
    code, hf, stderr = agent(root, "step", "regenerate", "--run", "tiny", "--backend", "hf", timeout=900)
    assert code == 0, stderr[-3000:]
    assert {row["id"]: row["input_ids"] for row in _rows(root)} == {row["id"]: row["input_ids"] for row in rows}
    assert {failure["id"] for failure in hf["failed"]} == failed
