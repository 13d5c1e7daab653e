"""`invoke plan --json` lists the model loads a run will make, each with its estimated time, and their total
(issue 34): a load of the target is the most expensive thing a run does, and the plan says so before any."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.planning.test_plan_task import _runs
from tests.support.cli import Cli


@pytest.mark.slow
def test_plan_lists_the_vllm_runs_loads_with_their_times_and_the_hf_run_none(cli: Cli, tmp_path: Path) -> None:
    runs = _runs(tmp_path, served={"backend": "vllm", "plan": {"load_seconds": 1080}}, replayed={})
    env = {"SPECOPS_RUNS_DIR": str(runs)}

    served = cli("plan", "--host", "local", "--run", "served", "--json", timeout=600, **env)
    assert served.exit_code == 0, served.stderr[-3000:]
    loads = served.json()["loads"]
    assert [(load["serves"], load["steps"]) for load in loads["loads"]] == [
        ("the target, capturing hidden states", "regenerate, extract"),  # one server for both
        ("the target with the untrained draft", "the parity gate's served request"),
        ("the target with the trained draft", "evaluate"),
    ]
    assert [load["seconds"] for load in loads["loads"]] == [1080, 1080, 1080]
    assert (loads["count"], loads["total_seconds"], loads["source"]) == (3, 3240, "run config: plan.load_seconds")
    assert loads["read_gb_per_s"] == round(loads["weight_bytes"] / 1080 / 1e9, 3)

    shown = cli("plan", "--host", "local", "--run", "served", timeout=600, **env)
    assert "model loads: 3, 54 min 00 s in all" in shown.stdout

    replayed = cli("plan", "--host", "local", "--run", "replayed", "--json", timeout=600, **env)
    assert replayed.exit_code == 0, replayed.stderr[-3000:]
    assert replayed.json()["loads"]["count"] == 0  # hf on a CPU host: no server at all


def test_the_text_view_counts_a_load_a_live_server_saves_apart_and_names_a_kept_server_it_stops() -> None:
    from remote.tasks.plan import load_time, loads_title

    assert loads_title({"count": 3, "reused": 0, "total_seconds": 3240}) == "model loads: 3, 54 min 00 s in all"
    assert loads_title({"count": 1, "reused": 1, "total_seconds": 1080}) == \
        "model loads: 1 (1 more served by a live server), 18 min 00 s in all"
    assert load_time({"seconds": 0.0, "uses": "vLLM server job j of run a"}) == \
        "none: vLLM server job j of run a serves it"
    assert load_time({"seconds": 1080, "replaces": "vLLM server job k of run b (kept for the next run)"}) == \
        "18 min 00 s; first stops vLLM server job k of run b (kept for the next run)"


def test_what_needs_the_port_later_follows_the_pipelines_backend_not_only_the_run_configs(tmp_path: Path) -> None:
    """`invoke pipeline --backend vllm` on a run whose config says hf: its later loads (the gate's served
    check, evaluate) need the port, so a server its run still owns is refused before the first step."""
    from specops.pipeline.plan import later_needs
    from specops.pipeline.run import Run
    from tests.support.mla import mla_workdir

    run = Run("mla", mla_workdir(tmp_path, backend="hf", parity={"serve": None}, evaluate={"backend": None}))
    assert later_needs(run, 0, run.config.backend) == []  # the run config's hf: no server at all
    assert later_needs(run, 0, "vllm") == ["the parity gate's served request", "evaluate"]
    assert later_needs(run, 0, "hf") == []


def test_on_a_gpu_host_the_speedups_baseline_is_a_load_of_its_own_and_the_plan_counts_it(tmp_path: Path) -> None:
    """On an H100 the extraction server read the real target at 94 tokens/s against a plain server's 680: its
    captures slow the target ~7x there, so a speedup against it would read ~7x high. By default a GPU host measures
    the target alone on a server of its own (one more load, in the plan); a CPU host keeps the extraction server's
    rate (no load); `evaluate.baseline_server` decides either way. (Here regenerate asks the extraction server;
    the test below has regenerate's own server measure the baseline.)"""
    from specops.pipeline.plan import run_loads
    from specops.pipeline.run import Run, baseline_server
    from tests.support.mla import mla_workdir

    def loads(run: Run, gpus: int) -> list[str]:
        return [f"{load.serves}: {load.steps}" for load in run_loads(run, gpus, "vllm")]

    default = Run("mla", mla_workdir(tmp_path / "default", backend="vllm", parity={"serve": False},
                                     evaluate={"backend": None}, regenerate={"server": "extraction"}))
    assert default.config.evaluate.baseline_server is None
    assert baseline_server(default, 1)[0] is True and "GPU host" in baseline_server(default, 1)[1]
    assert baseline_server(default, 0)[0] is False and "CPU host" in baseline_server(default, 0)[1]
    assert "the target alone: evaluate (the speedup's baseline)" in loads(default, 1)
    assert "the target alone: evaluate (the speedup's baseline)" not in loads(default, 0)
    assert loads(default, 1)[-1] == "the target with the trained draft: evaluate"

    for value in (True, False):
        said = Run("mla", mla_workdir(tmp_path / str(value), backend="vllm", parity={"serve": False},
                                      evaluate={"backend": None, "baseline_server": value},
                                      regenerate={"server": "extraction"}))
        said_so = (value, f"{said.label}: evaluate.baseline_server")
        assert baseline_server(said, 0) == baseline_server(said, 1) == said_so
        for gpus in (0, 1):
            assert ("the target alone: evaluate (the speedup's baseline)" in loads(said, gpus)) is value


def test_on_a_gpu_host_regenerate_asks_a_plain_server_that_also_measures_the_baseline(tmp_path: Path) -> None:
    """The extraction server writes every request's prompt states (vLLM's hidden-states connector has no way to
    ask it not to): on an H100 it answered 68 conversations a second with the GPU 2-6 % busy. A GPU host's regenerate
    asks a plain server of its own, which measures evaluation's baseline before it stops: with the parity gate's
    served check off, the run loads three servers, as on a CPU host where regenerate and extract share one."""
    from specops.pipeline.plan import run_loads
    from specops.pipeline.run import Run, regenerate_server
    from tests.support.mla import mla_workdir

    def loads(run: Run, gpus: int) -> list[str]:
        return [f"{load.serves}: {load.steps}" for load in run_loads(run, gpus, "vllm")]

    default = Run("mla", mla_workdir(tmp_path / "default", backend="vllm", parity={"serve": False},
                                     evaluate={"backend": None}))
    assert default.config.regenerate.enabled and default.config.regenerate.server is None
    assert regenerate_server(default, 1)[0] == "own" and "GPU host" in regenerate_server(default, 1)[1]
    assert regenerate_server(default, 0)[0] == "extraction" and "CPU host" in regenerate_server(default, 0)[1]
    assert loads(default, 1) == ["the target alone: regenerate (its own server), evaluate's baseline",
                                 "the target, capturing hidden states: extract",
                                 "the target with the trained draft: evaluate"]
    assert loads(default, 0) == ["the target, capturing hidden states: regenerate, extract",
                                 "the target with the trained draft: evaluate"]
    # where evaluation loads no target alone (off, hf, or the extraction server's rate), a plain server would be a
    # load more (18 minutes at Kimi's size): the extraction server answers
    for evaluate in ({"enabled": False}, {"backend": "hf"}, {"backend": None, "baseline_server": False}):
        quiet = Run("mla", mla_workdir(tmp_path / str(len(str(evaluate))), backend="vllm", parity={"serve": False},
                                       evaluate=evaluate))
        assert regenerate_server(quiet, 1)[0] == "extraction", evaluate
        assert loads(quiet, 1)[0] == "the target, capturing hidden states: regenerate, extract"
    said = Run("mla", mla_workdir(tmp_path / "own", backend="vllm", parity={"serve": False},
                                  evaluate={"backend": None, "enabled": False}, regenerate={"server": "own"}))
    assert regenerate_server(said, 0) == ("own", f"{said.label}: regenerate.server")
    assert loads(said, 0) == ["the target alone: regenerate (its own server)",
                              "the target, capturing hidden states: extract"]
