"""The Kimi-K2.5 breaks of issue 33, each reintroduced on a copy of the real tiny Kimi model
(`python -m specops tiny --shape kimi`) and caught by the doctor in well under a second, before any load:
the class that loads the target, the wrapper's language-model path and its weight names, the router's
bias against `topk_method`, trust_remote_code at every loader the run reaches, and the CPU MLA latent."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from specops.analysis import ModuleIndex
from specops.cli import main
from specops.doctor import RunSettings
from specops.doctor._target import check_target

REPO = Path(__file__).resolve().parents[2]
VLLM_SITES = sorted((REPO / ".venv-vllm" / "lib").glob("python3*/site-packages"))
needs_vllm_source = pytest.mark.skipif(not VLLM_SITES, reason="no .venv-vllm (scripts/setup-vllm.sh)")
MODEL = "models/tiny-kimi-k25"


@pytest.fixture(scope="module")
def kimi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A workdir holding the tiny Kimi-K2.5 wrapper and runs/tiny-kimi.yaml, made once for the module."""
    workdir = tmp_path_factory.mktemp("kimi-workdir")
    (workdir / "runs").mkdir()
    shutil.copy(REPO / "runs" / "tiny-kimi.yaml", workdir / "runs" / "tiny-kimi.yaml")
    subprocess.run([sys.executable, "-m", "specops", "tiny", "--shape", "kimi"], check=True, capture_output=True,
                   env={**os.environ, "SPECOPS_WORKDIR": str(workdir)}, cwd=workdir)
    # The run's env as its pipeline leaves it: the sets that fit it applied through the product's own `patch
    # apply` (speculators-0.9.0-wrapper reads the wrapper's tokenizer), never by another test having run first.
    # Judged unpatched, that set's absence is a true error (the pristine-site tests below judge that state).
    command = [sys.executable, "-m", "specops", "patch", "apply", "--patches-dir", str(REPO / "patches")]
    applied = subprocess.run(command, capture_output=True, text=True,
                             env={**os.environ, "SPECOPS_WORKDIR": str(workdir)}, cwd=workdir, timeout=600)
    assert applied.returncode == 0, applied.stdout[-2000:] + applied.stderr[-2000:]
    yield workdir


def broken_copy(kimi: Path, tmp_path: Path) -> Path:
    model = tmp_path / "tiny-kimi-k25"
    shutil.copytree(kimi / MODEL, model)
    return model


def edit_config(model: Path, change: Callable[[dict], None]) -> None:
    config = json.loads((model / "config.json").read_text())
    change(config)
    (model / "config.json").write_text(json.dumps(config))


def rewrite_weights(model: Path, rename: Callable[[str], str | None]) -> None:
    """model.safetensors with each tensor renamed (None drops it), its bytes copied as they are."""
    file = model / "model.safetensors"
    raw = file.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header, data = json.loads(raw[8:8 + length]), raw[8 + length:]
    kept: dict = {"__metadata__": header.pop("__metadata__")} if "__metadata__" in header else {}
    chunks, offset = [], 0
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        new = rename(name)
        if new is None:
            continue
        start, end = entry["data_offsets"]
        chunks.append(data[start:end])
        kept[new] = {**entry, "data_offsets": [offset, offset + end - start]}
        offset += end - start
    encoded = json.dumps(kept).encode()
    encoded += b" " * (-len(encoded) % 8)
    file.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks))


def doctor(capsys: pytest.CaptureFixture[str], *args: str, run: dict | None = None) -> tuple[int, dict, float]:
    began = time.perf_counter()
    code = main(["doctor", "--no-import", *args] + (["--run-json", json.dumps(run)] if run is not None else []))
    return code, json.loads(capsys.readouterr().out), time.perf_counter() - began


def judged(capsys: pytest.CaptureFixture[str], model: Path, *args: str, **settings) -> tuple[list[dict], float]:
    """The model check's findings on `model` as the tiny-kimi run sets it (hf backend, trusted)."""
    run = {"model_path": str(model), "trust_remote_code": True, "backend": "hf", "draft_vocab_size": 256, **settings}
    _code, document, seconds = doctor(capsys, "--checks", "model", *args, run=run)
    return document["findings"], seconds


def errors(findings: list[dict]) -> list[dict]:
    return [f for f in findings if f["result"] == "error"]


def test_the_unbroken_kimi_run_has_no_false_errors_and_the_loader_agrees_with_the_doctor(
        capsys: pytest.CaptureFixture[str], kimi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECOPS_WORKDIR", str(kimi))
    code, document, _ = doctor(capsys, "--run", "tiny-kimi")

    assert [f for f in document["findings"] if f["result"] == "error"] == [] and code == 0
    model = {f["why"].split(" (")[0]: f for f in document["findings"] if f["check"] == "model"}
    loads = model["the target loads as Kimi_K25ForConditionalGeneration"]
    assert loads["result"] == "ok" and loads["where"].endswith(
        f"transformers/models/auto/modeling_auto.py:{loads['where'].rsplit(':', 1)[1]}")
    assert "AutoModelForCausalLM refuses this model_type" in loads["why"]
    text = next(f for f in document["findings"] if "keeps its text model at model.language_model" in f["why"])
    assert text["result"] == "ok" and "DeepseekV3Model, modeling_kimi_k25.py:" in text["why"]
    assert "4 layers under language_model.model.layers.N" in text["why"]
    assert "its head as language_model.lm_head.weight" in text["why"]
    assert any(f["result"] == "ok" and "e_score_correction_bias is in the checkpoint for all 3 routed layers"
               in f["why"] for f in document["findings"])
    assert any(f["result"] == "ok" and "every loader the run reaches passes trust_remote_code" in f["why"]
               for f in document["findings"])
    assert any(f["result"] == "ok" and "auto_map AutoTokenizer: TikTokenTokenizer is defined in tokenization_kimi.py"
               in f["why"] for f in document["findings"])
    # one fact, one place: the step that loads the target asks the same function and gets the same class
    from specops.pipeline import open_run
    from specops.pipeline.target import target_class_name

    assert target_class_name(open_run("tiny-kimi")) == "Kimi_K25ForConditionalGeneration"


def test_a_model_type_without_a_generating_class_is_an_error_before_any_load(
        capsys: pytest.CaptureFixture[str], kimi: Path, tmp_path: Path) -> None:
    model = broken_copy(kimi, tmp_path)
    edit_config(model, lambda config: config.update(model_type="kimi_k25_vision"))  # transformers has no LM for it

    findings, seconds = judged(capsys, model)

    [error] = [f for f in errors(findings) if "generates text" in f["why"]]
    assert ("model_type: 'kimi_k25_vision' has no class that generates text in transformers' auto mappings"
            in error["why"])
    assert error["where"].endswith("transformers/models/auto/modeling_auto.py") and error["fix"]
    assert seconds < 5


def test_automodelforcausallm_in_the_pipeline_on_the_wrapper_is_an_error(kimi: Path, tmp_path: Path) -> None:
    pipeline = tmp_path / "pipeline"
    pipeline.mkdir()
    (pipeline / "target.py").write_text("from transformers import AutoModelForCausalLM\n\n\n"
                                        "def load_target(run):\n"
                                        "    return AutoModelForCausalLM.from_pretrained(str(run.model_path))\n")
    settings = RunSettings(model_path=str(kimi / MODEL), trust_remote_code=True, backend="hf")

    items = check_target(ModuleIndex(), settings, cpu_serving=False, pipeline=pipeline)

    [error] = [item for item in items if item.result == "error"]
    assert error.where == f"{pipeline / 'target.py'}:5"
    assert "AutoModelForCausalLM.from_pretrained (target.py:5) refuses model_type 'kimi_k25'" in error.why
    assert "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES" in error.why and "Kimi_K25ForConditionalGeneration" in error.why


def test_text_model_weights_outside_the_wrappers_language_model_path_are_an_error(
        capsys: pytest.CaptureFixture[str], kimi: Path, tmp_path: Path) -> None:
    model = broken_copy(kimi, tmp_path)
    rewrite_weights(model, lambda name: name.replace("language_model.model.", "text_model.", 1))

    findings, seconds = judged(capsys, model)

    [error] = [f for f in errors(findings) if "keeps its text model" in f["why"]]
    assert error["where"] == str(model / "model.safetensors")
    assert "keeps its text model at model.language_model (DeepseekV3Model" in error["why"]
    assert "holds no 4 text-model layers under language_model.model.layers.N or model.language_model.layers.N" in \
        error["why"]
    assert "text_model.layers.* (4)" in error["why"]
    assert seconds < 5


def test_a_run_config_without_trust_remote_code_is_an_error(
        capsys: pytest.CaptureFixture[str], kimi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = (kimi / "runs" / "tiny-kimi.yaml").read_text()
    untrusted = kimi / "runs" / "tiny-kimi-untrusted.yaml"
    untrusted.write_text("\n".join(line for line in config.splitlines() if not line.startswith("trust_remote_code")))
    monkeypatch.setenv("SPECOPS_WORKDIR", str(kimi))
    try:
        code, document, _ = doctor(capsys, "--run", "tiny-kimi-untrusted", "--checks", "model")
    finally:
        untrusted.unlink()

    assert code == 1
    [error] = errors(document["findings"])
    assert error["where"].endswith(f"{MODEL}/tokenizer_config.json")
    assert "the tokenizer is remote code (auto_map) and the run does not set trust_remote_code" in error["why"]


def test_a_train_command_without_trust_remote_code_is_an_error(
        capsys: pytest.CaptureFixture[str], kimi: Path) -> None:
    findings, _ = judged(capsys, kimi / MODEL, train_flags=["--verifier-name-or-path", "--data-path"])

    [error] = errors(findings)
    assert error["where"] == "speculators train"
    assert "the run's speculators train command has no --trust-remote-code" in error["why"]


@pytest.mark.wheels
def test_a_speculators_loader_without_trust_remote_code_is_an_error_unless_a_fitting_patch_set_fixes_it(
        capsys: pytest.CaptureFixture[str], kimi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # speculators 0.9.0's regenerate-responses loads the tokenizer bare (cli/regenerate_responses.py): the
    # vllm backend's regenerate step runs it; the hf backend never does, so it is not judged there. The
    # released wheel is judged (the checkout's .venv may carry the fix already, applied by a pipeline).
    from tests.support.wheels import site_with

    pristine = site_with(tmp_path / "site", ("speculators", "0.9.0"))
    no_patches = tmp_path / "workdir-without-patches"
    no_patches.mkdir()
    monkeypatch.setenv("SPECOPS_WORKDIR", str(no_patches))
    served, _ = judged(capsys, kimi / MODEL, "--site", str(pristine), backend="vllm")
    local, _ = judged(capsys, kimi / MODEL, "--site", str(pristine))

    [error] = [f for f in errors(served) if "trust_remote_code" in f["why"]]
    assert error["where"].startswith(str(pristine / "speculators" / "cli" / "regenerate_responses.py:"))
    assert "speculators 0.9.0 loads the tokenizer without trust_remote_code" in error["why"]
    assert "this model's tokenizer is remote code" in error["why"]
    assert not [f for f in errors(local) if "trust_remote_code" in f["why"]]

    # the pipeline's first step applies every patch set that fits this host: before it (--as-patched) the
    # doctor judges the code as the set speculators-0.9.0-remote-code will leave it, and says so, writing
    # nothing; without --as-patched it judges what is installed
    with_patches = tmp_path / "workdir-with-patches"
    with_patches.mkdir()
    (with_patches / "patches").symlink_to(REPO / "patches")
    monkeypatch.setenv("SPECOPS_WORKDIR", str(with_patches))
    before = (pristine / "speculators" / "cli" / "regenerate_responses.py").read_bytes()
    installed, _ = judged(capsys, kimi / MODEL, "--site", str(pristine), backend="vllm")
    assert [f for f in errors(installed) if "trust_remote_code" in f["why"]]
    served, _ = judged(capsys, kimi / MODEL, "--site", str(pristine), "--as-patched", backend="vllm")
    assert not [f for f in errors(served) if "trust_remote_code" in f["why"]]
    [judged_patched] = [f for f in served if f["check"] == "patches" and "remote-code" in f["where"]]
    assert "regenerate-tokenizer-trust" in judged_patched["why"] and "not applied yet" in judged_patched["why"]
    assert (pristine / "speculators" / "cli" / "regenerate_responses.py").read_bytes() == before


def shard_index(model: Path, keep: Callable[[str], bool]) -> Path:
    """model.safetensors.index.json over the single file, as a sharded checkpoint (Kimi-K2.5: 64 shards)
    names its tensors; the doctor reads the index first."""
    raw = (model / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    names = [name for name in json.loads(raw[8:8 + length]) if name != "__metadata__" and keep(name)]
    index = model / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {name: "model.safetensors" for name in names}}))
    return index


@pytest.mark.parametrize("named_in", ["safetensors header", "shard index"])
def test_a_checkpoint_without_the_routers_bias_is_an_error(
        capsys: pytest.CaptureFixture[str], kimi: Path, tmp_path: Path, named_in: str) -> None:
    model = broken_copy(kimi, tmp_path)
    unbiased = lambda name: not name.endswith("e_score_correction_bias")  # noqa: E731
    if named_in == "shard index":
        source = shard_index(model, unbiased)
    else:
        rewrite_weights(model, lambda name: name if unbiased(name) else None)
        source = model / "model.safetensors"

    findings, seconds = judged(capsys, model)

    [error] = errors(findings)
    assert error["where"] == str(source)
    assert ("config.json says topk_method: noaux_tc but the checkpoint has no mlp.gate.e_score_correction_bias "
            "for 3 of its 3 routed layers (layers [1, 2, 3])") in error["why"]
    assert seconds < 5


def test_a_bias_without_noaux_tc_in_the_config_is_an_error(
        capsys: pytest.CaptureFixture[str], kimi: Path, tmp_path: Path) -> None:
    model = broken_copy(kimi, tmp_path)
    edit_config(model, lambda config: config["text_config"].pop("topk_method"))

    findings, _ = judged(capsys, model)

    [error] = errors(findings)
    assert error["where"] == str(model / "config.json")
    assert "holds mlp.gate.e_score_correction_bias for 3 routed layers but config.json says topk_method: None" in \
        error["why"]
    assert error["fix"] == "set topk_method: noaux_tc in config.json (text_config)"


@needs_vllm_source
def test_an_mla_latent_the_cpu_kernel_cannot_take_is_an_error_on_a_cpu_serve_env(
        capsys: pytest.CaptureFixture[str], kimi: Path, tmp_path: Path) -> None:
    model = broken_copy(kimi, tmp_path)
    edit_config(model, lambda config: config["text_config"].update(kv_lora_rank=256))
    site = ["--site", str(VLLM_SITES[0])]

    findings, seconds = judged(capsys, model, *site, backend="vllm", gpus=0)
    unbroken, _ = judged(capsys, kimi / MODEL, *site, backend="vllm", gpus=0)

    [error] = [f for f in errors(findings) if "MLA latent" in f["why"]]
    assert error["where"] == str(model / "config.json")
    assert "MLA latent kv_lora_rank 256 + qk_rope_head_dim 64 = 320: vLLM's CPU MLA backend takes only [576]" in \
        error["why"]
    assert "vllm/v1/attention/backends/mla/cpu_mla.py:" in error["why"]
    assert any(f["result"] == "ok" and "= 576: a width vLLM's CPU MLA backend takes" in f["why"] for f in unbroken)
    assert seconds < 5


def test_a_checkpoint_without_the_text_models_head_is_an_error(
        capsys: pytest.CaptureFixture[str], kimi: Path, tmp_path: Path) -> None:
    model = broken_copy(kimi, tmp_path)
    rewrite_weights(model, lambda name: None if name == "language_model.lm_head.weight" else name)

    findings, _ = judged(capsys, model)

    [error] = errors(findings)
    assert error["where"] == str(model / "model.safetensors")
    assert "the checkpoint has no LM head (language_model.lm_head.weight or lm_head.weight)" in error["why"]


def test_a_remote_code_tokenizer_without_its_module_is_an_error(
        capsys: pytest.CaptureFixture[str], kimi: Path, tmp_path: Path) -> None:
    model = broken_copy(kimi, tmp_path)
    (model / "tokenization_kimi.py").unlink()

    findings, _ = judged(capsys, model)

    [error] = errors(findings)
    assert error["where"] == str(model / "tokenizer_config.json")
    assert ("auto_map AutoTokenizer names tokenization_kimi.TikTokenTokenizer, but tokenization_kimi.py is missing "
            "beside the weights") in error["why"]


def test_a_serve_command_without_trust_remote_code_is_an_error(
        capsys: pytest.CaptureFixture[str], kimi: Path) -> None:
    findings, _ = judged(capsys, kimi / MODEL, serve_flags=["--port", "--max-model-len"],
                         train_flags=["--verifier-name-or-path", "--trust-remote-code"])

    [error] = [f for f in errors(findings) if f["where"] != "speculators train"]
    assert error["where"] == "vllm serve"
    assert "the run's vllm serve command has no --trust-remote-code" in error["why"]
    assert any(f["result"] == "ok" and f["where"] == "speculators train" for f in findings)


@pytest.mark.wheels
def test_speculators_train_building_the_wrappers_native_processor_is_an_error_unless_the_wrapper_set_fixes_it(
        capsys: pytest.CaptureFixture[str], kimi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # speculators 0.9.0's load_processor asks AutoProcessor, which builds kimi_k25's native Kimi_K25Processor
    # (an image processor: a preprocessor config and torchvision) for a folder that ships no processor
    # config: `speculators train` used to stop there, after regenerate and extraction had loaded the target
    from tests.support.wheels import site_with

    pristine = site_with(tmp_path / "site", ("speculators", "0.9.0"))
    workdir = tmp_path / "workdir"
    (workdir / "patches").mkdir(parents=True)
    (workdir / "patches" / "speculators-0.9.0-wrapper").symlink_to(REPO / "patches" / "speculators-0.9.0-wrapper")
    monkeypatch.setenv("SPECOPS_WORKDIR", str(workdir))
    loader = pristine / "speculators" / "data_generation" / "preprocessing.py"

    installed, seconds = judged(capsys, kimi / MODEL, "--site", str(pristine))
    [error] = [f for f in errors(installed) if "processor" in f["why"]]
    assert error["where"].startswith(f"{loader}:")
    assert "Kimi_K25Processor" in error["why"] and "ships no processor config" in error["why"]
    assert "speculators-0.9.0-wrapper" in error["fix"]
    assert seconds < 30  # before any load: no model, no server, no import of what is judged

    # the pipeline applies the set first: judged as patched, the folder is read as text only
    patched, _ = judged(capsys, kimi / MODEL, "--site", str(pristine), "--as-patched")
    assert not [f for f in errors(patched) if "processor" in f["why"]]
    assert [f for f in patched if f["result"] == "ok" and "as text only" in f["why"]]

    # a folder that ships its own processor config gets AutoProcessor's reading, nothing to judge here
    with_config = broken_copy(kimi, tmp_path)
    (with_config / "preprocessor_config.json").write_text("{}")
    judged_config, _ = judged(capsys, with_config, "--site", str(pristine))
    assert not [f for f in errors(judged_config) if "processor" in f["why"]]


@needs_vllm_source
def test_serving_the_wrapper_without_the_checkpoints_processor_is_an_error_on_the_vllm_backend(
        capsys: pytest.CaptureFixture[str], kimi: Path) -> None:
    # vLLM's kimi_k25 builds the checkpoint's own processor at the server's start (it reads the image
    # processor's media_tokens_calculator): the tiny wrapper ships none, so its server could never start
    serve_python = REPO / ".venv-vllm" / "bin" / "python"
    served, seconds = judged(capsys, kimi / MODEL, "--serve-python", str(serve_python), backend="vllm")
    [error] = [f for f in errors(served) if "multimodal model" in f["why"]]
    assert error["where"].split(":")[0].endswith("vllm/model_executor/models/registry.py")
    assert "KimiK25ForConditionalGeneration" in error["why"] and "kimi_k25.py" in error["why"]
    assert "tiny-kimi-text" in error["fix"] and seconds < 30
    local, _ = judged(capsys, kimi / MODEL, "--serve-python", str(serve_python))  # hf: no server
    assert not [f for f in errors(local) if "multimodal model" in f["why"]]


def test_as_patched_without_a_run_is_one_line_of_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--no-import", "--as-patched"])
    document = json.loads(capsys.readouterr().out)
    assert code == 2 and document["error"] == ("doctor --as-patched: only with --run or --run-json "
                                                "(it judges a run's launch)")
