"""`regenerate.server: own` (a GPU host's default): regenerate asks a plain server of the target alone, not the
extraction server, whose hidden-states connector writes every request's prompt states (on an H100 it answered 68
conversations a second with the GPU 2-6 % busy). Before that server stops it measures evaluation's baseline, the
held-out prompts and every benchmark set, so a run that asks for the honest baseline (evaluate.baseline_server)
still loads three servers, as `invoke plan` counts them: the target alone, the extraction server, the draft's.

One tiny pipeline on the real vLLM CPU build, the choice made in the run config (on a CPU host the default is the
extraction server: tests/vllm/test_loads.py).
"""

from __future__ import annotations

import json
import os

import pytest
import yaml

from tests.support.agent import REPO, run_agent
from tests.support.sets import write_sets
from tests.support.vllm import tiny_workdir
from tests.vllm.conftest import VLLM_PYTHON, free_port, in_vllm_worker, needs_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs_vllm, in_vllm_worker]

RUN = "ownserver"
ENV = {"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON), "VLLM_CPU_KVCACHE_SPACE": "1"}


@pytest.fixture(scope="module")
def piped(patched_vllm, tmp_path_factory) -> dict:
    root = tiny_workdir(tmp_path_factory.mktemp("own") / "w", free_port())
    os.symlink(REPO / "patches", root / "patches")
    write_sets(root / "bench")
    config = yaml.safe_load((REPO / "runs" / "tiny.yaml").read_text())
    config.update(backend="vllm", samples=16)
    config["vllm"]["port"] = free_port()
    config["train"]["epochs"] = 1
    config["regenerate"].update(server="own", max_tokens=24, concurrency=8)
    config["evaluate"].update(heldout_prompts=4, max_tokens=16, baseline_server=True, set_prompts=2,
                              sets={"mtbench": "bench/question.jsonl"})
    config["parity"] = {"serve": False}
    (root / "runs" / f"{RUN}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    code, summary, stderr = run_agent(root, "pipeline", "--run", RUN, env=ENV, timeout=2400)
    assert code == 0, json.dumps(summary)[:3000] + stderr[-6000:]
    jobs = root / "state" / "jobs"
    records = [json.loads(path.read_text()) for path in sorted(jobs.glob("*.json"))]
    servers = [record for record in records if record["name"] == "vllm-server" and record["run"] == RUN]
    return {"root": root, "summary": summary, "stderr": stderr, "servers": servers}


def test_regenerate_asks_a_plain_server_which_stops_before_extract_loads_its_own(piped) -> None:
    serves = [record["meta"]["serves"] for record in piped["servers"]]
    assert serves[0] == "the target alone" and serves[1] == "the target, capturing hidden states", serves
    assert "--kv_transfer_config" not in piped["servers"][0]["argv"]
    assert "--kv_transfer_config" in piped["servers"][1]["argv"]
    stderr = piped["stderr"]
    assert stderr.index("== regenerate") < stderr.index("regenerate's own server: the answers are written") \
        < stderr.index("== extract")
    answers = (piped["root"] / "runs" / RUN / "regenerated" / "responses.jsonl").read_text().splitlines()
    assert len(answers) >= 16


def test_its_server_measures_the_baseline_so_the_run_loads_three_servers_as_planned(piped) -> None:
    from specops.pipeline.plan import run_loads
    from specops.pipeline.run import Run

    assert piped["summary"]["servers"]["starts"] == len(piped["servers"]) == 3
    planned = run_loads(Run(RUN, piped["root"]), 0, "vllm")
    served = [record["meta"]["serves"] for record in piped["servers"]]
    assert [load.serves for load in planned] == [*served[:2], "the target with the trained draft"]
    assert served[2].startswith("the target with draft")
    assert "evaluate's baseline" in planned[0].steps
    assert "regenerate: the target alone, for evaluation's speedup:" in piped["stderr"]
    assert "extract: the target alone" not in piped["stderr"]  # the record regenerate's server wrote serves


def test_the_evaluation_takes_the_plain_servers_rates_for_the_held_out_prompts_and_each_set(piped) -> None:
    from specops.pipeline.vllm.baseline import BASELINE_FILE, OWN_HOW

    record = json.loads((piped["root"] / "runs" / RUN / BASELINE_FILE).read_text())
    assert record["plain"] is True and record["how"] == OWN_HOW and record["prompts"] == 4
    assert record["job"] == piped["servers"][0]["id"] and record["tokens_per_s"] > 0
    assert set(record["sets"]) == {"mtbench"} and record["sets"]["mtbench"]["tokens_per_s"] > 0
    evaluation = piped["summary"]["evaluation"]
    report = evaluation["report"]
    assert report["speedup_baseline"]["how"] == OWN_HOW and report["tokens_per_s_base"] == record["tokens_per_s"]
    trained = evaluation["sets"]["mtbench"]["trained"]
    assert trained["speedup_baseline"]["tokens_per_s"] == record["sets"]["mtbench"]["tokens_per_s"]
    assert trained["speedup"] is not None
