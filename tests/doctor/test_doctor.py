"""`python -m specops doctor` on real wheel pairs, a tiny model folder and a multimodal wrapper config."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specops.analysis import ModuleIndex
from specops.cli import main
from specops.doctor._contract import PIPELINE, check_pipeline_contract


def doctor(capsys: pytest.CaptureFixture[str], *args: str, run: dict | None = None) -> tuple[int, dict]:
    argv = ["doctor", *args] + (["--run-json", json.dumps(run)] if run is not None else [])
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def items(document: dict, check: str, result: str | None = None) -> list[dict]:
    return [f for f in document["findings"] if f["check"] == check and (result is None or f["result"] == result)]


def model_folder(root: Path, config: dict, tokenizer: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    (root / "tokenizer_config.json").write_text(json.dumps(tokenizer or {"chat_template": "{{ messages }}"}))
    return root


TINY = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4, "hidden_size": 64, "vocab_size": 512}
KIMI_LIKE = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
             "text_config": {"num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 163840}}


@pytest.mark.wheels
def test_speculators_030_with_vllm_016_fails_on_each_real_break(
        capsys: pytest.CaptureFixture[str], site_030: Path, tmp_path: Path) -> None:
    model = model_folder(tmp_path / "tiny", TINY)
    code, document = doctor(capsys, "--site", str(site_030), run={"model_path": str(model)})
    assert code == 1 and document["ok"] is False
    assert document["versions"]["speculators"] == "0.3.0" and document["versions"]["vllm"] == "0.16.0"
    errors = {f["where"].rsplit("/", 1)[-1]: f for f in items(document, "api", "error")}
    # the three module-level call breaks, the rename inside the function bound onto LlamaModel, and
    # the engine-loop step (sample_tokens) the generator's hand-driven loop at line 253 never makes
    assert set(errors) == {"vllm_hidden_states_generator.py:136", "vllm_hidden_states_generator.py:148",
                           "vllm_hidden_states_generator.py:194", "custom_worker.py:30",
                           "vllm_hidden_states_generator.py:253"}
    assert "no attribute 'get_input_embeddings'" in errors["custom_worker.py:30"]["why"]
    assert "never calls sample_tokens" in errors["vllm_hidden_states_generator.py:253"]["why"]
    assert "unexpected keyword 'kv_cache_specs'" in errors["vllm_hidden_states_generator.py:136"]["why"]
    assert "'block_size'" in errors["vllm_hidden_states_generator.py:148"]["why"]
    assert "'is_encoder_decoder'" in errors["vllm_hidden_states_generator.py:194"]["why"]
    assert all(f["fix"] for f in errors.values())
    eagle3 = [f for f in items(document, "capability") if "SupportsEagle3" in f["why"]]
    assert [f["result"] for f in eagle3] == ["ok"]


@pytest.mark.wheels
def test_speculators_0401_with_vllm_016_has_no_api_errors(
        capsys: pytest.CaptureFixture[str], site_0401: Path) -> None:
    _, document = doctor(capsys, "--site", str(site_0401))
    assert items(document, "api", "error") == []
    assert items(document, "api", "ok")


@pytest.mark.wheels
def test_flags_are_checked_against_the_installed_definitions(
        capsys: pytest.CaptureFixture[str], site_030: Path) -> None:
    run = {"serve_flags": ["--speculative_config", "{}", "--kv-transfer-config={}", "--made-up-flag"],
           "prepare_flags": ["--model", "m"]}
    _, document = doctor(capsys, "--site", str(site_030), "--checks", "flags", run=run)
    results = {f["where"]: f["result"] for f in items(document, "flags")}
    assert results == {"vllm serve --speculative_config": "ok", "vllm serve --kv-transfer-config": "ok",
                       "vllm serve --made-up-flag": "error", "speculators prepare-data": "error"}


@pytest.mark.wheels
def test_a_wrapper_config_is_read_through_text_config(
        capsys: pytest.CaptureFixture[str], site_030: Path, tmp_path: Path) -> None:
    model = model_folder(tmp_path / "kimi", KIMI_LIKE,
                         {"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}})
    run = {"model_path": str(model), "layer_ids": [2, 30, 58, 61], "draft_vocab_size": 32000,
           "trust_remote_code": True}
    _, document = doctor(capsys, "--site", str(site_030), "--checks", "model,capability", run=run)
    model_items = items(document, "model")
    assert any("text_config" in f["why"] and f["result"] == "ok" for f in model_items)
    layer = next(f for f in model_items if f["where"] == "layer_ids")
    assert layer["result"] == "error" and "[61] out of range for 61 layers" in layer["why"]
    assert next(f for f in model_items if f["where"] == "draft_vocab_size")["result"] == "ok"
    tokenizer = [f for f in model_items if "trust_remote_code" in f["why"]]
    assert [f["result"] for f in tokenizer] == ["error"]  # 0.3.0's generator does not pass it
    assert any(f["result"] == "warn" and "model.language_model.model" in f["why"] for f in model_items)
    assert any(f["result"] == "error" and "KimiK25ForConditionalGeneration" in f["why"]
               for f in items(document, "capability"))


def test_tiny_model_config_and_resources(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECOPS_WORKDIR", str(tmp_path / "work"))
    model = model_folder(tmp_path / "tiny", TINY, {"auto_map": {"AutoTokenizer": ["x.Tok", None]}})
    run = {"model_path": str(model), "layer_ids": [1, 2, 3], "draft_vocab_size": 1024, "samples": 10**9,
           "max_seq_len": 4096, "backend": "hf", "output_dir": str(tmp_path / "out" / "hs"),
           "staging_dir": str(tmp_path / "staging")}
    code, document = doctor(capsys, "--checks", "model,resources", run=run)
    assert code == 1
    assert set(document["timing_s"]) == {"model", "resources", "total"}
    by_where = {f["where"]: f for f in items(document, "model") + items(document, "resources")}
    assert by_where["draft_vocab_size"]["result"] == "error"
    assert by_where["layer_ids"]["result"] == "ok"
    assert next(f for f in items(document, "model") if "auto_map" in f["why"])["result"] == "error"
    storage = by_where[str(tmp_path / "out" / "hs")]
    # no GPU here: an "auto" target computes, and writes its hidden states, in float32
    assert storage["result"] == "error" and "3 layers x 64 x 4 bytes (float32) = 768 bytes a token" in storage["why"]
    assert "upper bound: 1000000000 rows x max_seq_len 4096" in storage["why"]
    assert by_where[f"{tmp_path / 'staging'} -> {tmp_path / 'out' / 'hs'}"]["result"] == "ok"
    assert by_where[str(tmp_path / "work")]["result"] == "ok"
    assert items(document, "capability") == []  # the hf backend needs no vLLM


def test_staging_on_another_filesystem_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem to stage on")
    run = {"backend": "hf", "output_dir": str(tmp_path / "out"), "staging_dir": str(other / "specops-staging")}
    _, document = doctor(capsys, "--checks", "resources", run=run)
    crossing = [f for f in items(document, "resources") if "->" in f["where"]]
    assert [f["result"] for f in crossing] == ["error"]


@pytest.mark.parametrize("run_json, message", [
    ("{not json", "--run-json: not valid JSON"),
    ('{"layer_ids": [1, "2"]}', "--run-json: key layer_ids: expected a list of integers or null"),
    ('{"backend": "tgi"}', "--run-json: key backend: expected 'vllm' or 'hf'"),
    ('{}', "--checks: unknown check 'speed'"),
])
def test_bad_run_settings_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], run_json: str,
                                                  message: str) -> None:
    extra = ["--checks", "api,speed"] if run_json == "{}" else []
    code = main(["doctor", "--run-json", run_json, *extra])
    document = json.loads(capsys.readouterr().out)
    assert code == 2 and document["error"].startswith(message) and "\n" not in document["error"]


@pytest.mark.wheels
def test_check_1_covers_specops_own_pipeline_calls(capsys: pytest.CaptureFixture[str], site_030: Path) -> None:
    _, document = doctor(capsys, "--site", str(site_030), "--checks", "api")
    pipeline = [f for f in items(document, "api") if f["where"] == "specops.pipeline"
                or f["where"].startswith(str(PIPELINE))]
    summary = [f for f in pipeline if f["where"] == "specops.pipeline"]
    assert [f["result"] for f in summary] == ["ok"]
    assert "into speculators, transformers, vllm bind" in summary[0]["why"]
    assert [f for f in pipeline if f["result"] == "error"] == []


@pytest.mark.wheels
def test_a_pipeline_call_that_no_longer_binds_is_an_error_with_file_and_line(site_030: Path, tmp_path: Path) -> None:
    steps = tmp_path / "pipeline"
    steps.mkdir()
    (steps / "extract.py").write_text(
        "from vllm.config import SchedulerConfig\n"
        "from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups\n\n\n"
        "def configure(groups, memory):\n"
        "    get_kv_cache_config_from_groups(None, groups, memory)\n"
        "    return SchedulerConfig(max_num_seqs=8)\n")
    (steps / "unrelated.py").write_text("import json\n\n\ndef dump(x):\n    return json.dumps(x)\n")

    found = check_pipeline_contract(ModuleIndex([str(site_030)]), {"vllm": "0.16.0"}, steps)

    [error] = [f for f in found if f.result == "error"]
    assert error.where == f"{steps / 'extract.py'}:7"
    assert "missing required parameter 'max_model_len'" in error.why
    assert error.fix == "update specops's extract.py for vllm 0.16.0"
    assert found[-1].result == "ok" and found[-1].why.startswith("3 calls and imports of specops's pipeline")


RUN_ROWS = {"flags", "model", "resources"}


@pytest.mark.wheels
def test_without_a_run_the_doctor_judges_the_installed_stack_alone(
        capsys: pytest.CaptureFixture[str], site_0401: Path) -> None:
    # --no-import: the import probe judges this machine's pydantic 2.14, under which `import speculators`
    # 0.4.0.1 really fails (its own test shows that finding); here only the static verdict of the pair counts.
    code, document = doctor(capsys, "--site", str(site_0401), "--no-import")
    assert code == 0 and document["ok"] is True and document["scope"] == "stack"
    assert {f["check"] for f in document["findings"]} <= {"api", "capability", "serving"}
    assert not RUN_ROWS & set(document["timing_s"])
    assert not any("layer_ids" in f["where"] or f["where"].startswith("speculators train")
                   for f in document["findings"])


@pytest.mark.wheels
def test_a_run_brings_the_run_checks_back(capsys: pytest.CaptureFixture[str], site_0401: Path,
                                          tmp_path: Path) -> None:
    model = model_folder(tmp_path / "tiny", TINY)
    _, document = doctor(capsys, "--site", str(site_0401), run={"model_path": str(model)})
    assert document["scope"] == "run"
    assert {"model", "resources"} <= {f["check"] for f in document["findings"]}


@pytest.mark.parametrize("checks", ["model", "api,flags", "resources"])
def test_run_checks_without_a_run_are_bad_input(capsys: pytest.CaptureFixture[str], checks: str) -> None:
    code = main(["doctor", "--checks", checks])
    document = json.loads(capsys.readouterr().out)
    assert code == 2 and "checks a run's settings; give --run NAME or --run-json" in document["error"]


def test_parallel_sizes_that_the_targets_heads_cannot_split_over_are_an_error(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model = model_folder(tmp_path / "tiny", {**TINY, "num_attention_heads": 2, "num_key_value_heads": 2})
    code, document = doctor(capsys, "--checks", "model",
                            run={"model_path": str(model), "gpus": 8, "tensor_parallel": 8, "data_parallel": 1})
    assert code == 1
    errors = items(document, "parallel", "error")
    # (2 KV heads replicate 4 times over 8 ranks: vLLM allows that; the query heads cannot split)
    assert [f["why"] for f in errors] == ["2 attention heads do not split over tensor parallel 8"]
    assert all(f["where"] == "vllm: tensor_parallel 8 x data_parallel 1" and f["fix"] for f in errors)


def test_parallel_sizes_beyond_the_hosts_gpus_are_an_error_and_fitting_ones_ok(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model = model_folder(tmp_path / "tiny", {**TINY, "num_attention_heads": 2, "num_key_value_heads": 2})
    _, document = doctor(capsys, "--checks", "model",
                         run={"model_path": str(model), "gpus": 4, "tensor_parallel": 2, "data_parallel": 4})
    assert [f["why"] for f in items(document, "parallel", "error")] == [
        "tensor 2 x data 4 = 8 GPUs, the host has 4"]
    _, document = doctor(capsys, "--checks", "model",
                         run={"model_path": str(model), "gpus": 8, "tensor_parallel": 2, "data_parallel": 4})
    assert [f["result"] for f in items(document, "parallel")] == ["ok"]
    assert "fits 8 GPU(s) and the target's 2 heads, 2 KV heads" in items(document, "parallel")[0]["why"]
