"""A target stored as it was published (issue 59): its quantization_config judged before any load, for every env
that loads it, from the installed transformers, compressed-tensors and vLLM files: the package at a version that
reads the format, the method on this build and hardware, the verifier's embeddings and lm_head unquantized. A
break is one line, exit 2, naming what mends it. The target is the tiny Kimi-K2.5 whose routed experts are int4
compressed-tensors (`python -m specops tiny --shape kimi-int4`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from specops.analysis import ModuleIndex
from specops.doctor import RunSettings, quantization_refusal, read_quantization, target_quantization
from specops.doctor._quantization import hf_items, verifier_items
from specops.doctor._quantization_vllm import vllm_items
from specops.planning import safetensors_header
from testing.agent import run_agent

REPO = Path(__file__).resolve().parents[2]
VLLM_SITES = [str(site) for site in sorted((REPO / ".venv-vllm" / "lib").glob("python3*/site-packages"))]
needs_vllm_source = pytest.mark.skipif(not VLLM_SITES, reason="no .venv-vllm (scripts/setup-vllm.sh)")
MODEL = "models/tiny-kimi-k25-int4"
FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}


@pytest.fixture(scope="module")
def kimi_int4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A workdir holding the tiny int4 Kimi-K2.5 and runs/tiny-kimi-int4.yaml, made once for the module."""
    workdir = tmp_path_factory.mktemp("kimi-int4")
    (workdir / "runs").mkdir()
    shutil.copy(REPO / "runs" / "tiny-kimi-int4.yaml", workdir / "runs" / "tiny-kimi-int4.yaml")
    subprocess.run([sys.executable, "-m", "specops", "tiny", "--shape", "kimi-int4"], check=True, capture_output=True,
                   env={**os.environ, "SPECOPS_WORKDIR": str(workdir)}, cwd=workdir)
    yield workdir


def without_compressed_tensors(tmp_path: Path) -> list[str]:
    """A search path holding the installed transformers (its real files) and no compressed-tensors."""
    import transformers

    package = Path(transformers.__file__).parent
    site = tmp_path / "site"
    if site.is_dir():
        return [str(site)]
    site.mkdir()
    (site / "transformers").symlink_to(package)
    for dist_info in package.parent.glob("transformers-*.dist-info"):
        (site / dist_info.name).symlink_to(dist_info)
    return [str(site)]


def with_quantization(tmp_path: Path, kimi_int4: Path, quantization: dict) -> Path:
    model = tmp_path / "model"
    shutil.copytree(kimi_int4 / MODEL, model)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = quantization
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_the_tiny_kimi_int4_stores_its_routed_experts_as_kimi_k25_publishes_them(kimi_int4: Path) -> None:
    model = kimi_int4 / MODEL
    header = safetensors_header(model / "model.safetensors")
    assert header is not None
    expert = "language_model.model.layers.1.mlp.experts.0.gate_proj."
    assert header[expert + "weight_packed"]["dtype"] == "I32"
    assert header[expert + "weight_packed"]["shape"] == [32, 8]          # 64 int4 values a row, 8 a word
    assert header[expert + "weight_scale"] == {**header[expert + "weight_scale"], "dtype": "BF16", "shape": [32, 2]}
    assert expert + "weight" not in header
    for plain in ("language_model.lm_head.weight", "language_model.model.embed_tokens.weight",
                  "language_model.model.layers.1.mlp.shared_experts.gate_proj.weight",
                  "language_model.model.layers.0.mlp.gate_proj.weight"):
        assert header[plain]["dtype"] == "F32", plain
    quant = read_quantization(json.loads((model / "config.json").read_text()), "config.json")
    assert quant is not None and quant.label == "compressed-tensors pack-quantized (int4 g32 symmetric)"
    assert "lm_head" in quant.ignore and quant.targets == ("Linear",)


def test_the_doctor_passes_the_int4_kimi_where_transformers_has_compressed_tensors(kimi_int4: Path) -> None:
    settings = RunSettings(model_path=str(kimi_int4 / MODEL), backend="hf", gpus=0)
    items = target_quantization(settings, sys.path, None, loads_hf=True)
    assert [item.result for item in items] == ["ok", "ok"]
    assert "loads it through CompressedTensorsHfQuantizer (compressed-tensors " in items[0].why
    assert "embeddings and lm_head are stored unquantized" in items[1].why
    assert quantization_refusal(items) is None


def test_without_compressed_tensors_the_hf_backend_is_refused_in_one_line_naming_the_install(
        kimi_int4: Path, tmp_path: Path) -> None:
    settings = RunSettings(model_path=str(kimi_int4 / MODEL), backend="hf", gpus=0)
    items = target_quantization(settings, without_compressed_tensors(tmp_path), None, loads_hf=True)
    line = quantization_refusal(items)
    assert line is not None and "\n" not in line
    assert "transformers 5.19.0 loads it only with compressed-tensors>=0.15.0 (CompressedTensorsHfQuantizer); " \
           "compressed-tensors is not installed in this env" in line
    assert "transformers/quantizers/quantizer_compressed_tensors.py:" in line  # where transformers asks for it
    assert line.endswith(f"mend: {sys.executable} -m pip install 'compressed-tensors>=0.15.0'")
    # with the vllm backend only an hf replay would load it with transformers: said, not refused
    items = target_quantization(RunSettings(model_path=str(kimi_int4 / MODEL), backend="vllm", gpus=0),
                                without_compressed_tensors(tmp_path), None, loads_hf=False)
    assert items[0].result == "warn" and quantization_refusal(items) is None


def test_a_method_this_transformers_has_no_quantizer_for_stops_every_step_before_the_first_load(
        kimi_int4: Path, tmp_path: Path) -> None:
    """NVFP4 as ModelOpt publishes it: transformers 5.19 has no `modelopt` quantizer, so the hf backend's steps
    are refused at the engine's entry (exit 2, one line), in well under a load's time."""
    workdir = tmp_path / "w"
    shutil.copytree(kimi_int4, workdir)
    with_quantization(tmp_path, kimi_int4, NVFP4)
    shutil.rmtree(workdir / MODEL)
    shutil.copytree(tmp_path / "model", workdir / MODEL)
    code, document, _ = run_agent(workdir, "step", "regenerate", "--run", "tiny-kimi-int4")
    assert code == 2
    assert document["error"].startswith(f"runs/tiny-kimi-int4.yaml: model: {workdir / MODEL / 'config.json'}: "
                                        "quant_method 'modelopt': transformers 5.19.0 has no quantizer for it")
    assert not (workdir / "runs" / "tiny-kimi-int4").exists()  # nothing written: refused at the entry


def test_fp8_on_a_cpu_host_is_dequantized_by_transformers() -> None:
    quant = read_quantization({"quantization_config": FP8}, "config.json")
    assert quant is not None
    [item] = hf_items(quant, ModuleIndex(sys.path), loads=True, gpus=0, capability=None, python="python")
    assert item.result == "ok" and "FineGrainedFP8HfQuantizer (accelerate " in item.why
    assert "dequantized to the compute dtype on this CPU host" in item.why


def test_a_quantized_lm_head_is_refused_for_the_trainer() -> None:
    quant = read_quantization({"quantization_config": {**FP8, "ignore": []}}, "config.json")
    assert quant is not None
    [item] = verifier_items(quant, ["lm_head.weight", "lm_head.weight_scale_inv", "model.embed_tokens.weight"],
                            tied=False)
    assert item.result == "error" and "stored quantized here: lm_head (lm_head.weight, lm_head.weight_scale_inv)" \
        in item.why


@needs_vllm_source
def test_the_cpu_build_serves_the_int4_kimi_and_refuses_fp8_in_float32(kimi_int4: Path) -> None:
    serving = ModuleIndex(VLLM_SITES)
    quant = read_quantization(json.loads((kimi_int4 / MODEL / "config.json").read_text()), "config.json")
    assert quant is not None
    [item] = vllm_items(quant, serving, platform="cpu", capability=None, serve_dtype="float32")
    assert item.result == "ok"
    assert item.why.startswith("compressed-tensors pack-quantized (int4 g32 symmetric): vLLM 0.32.0 serves it "
                               "through CompressedTensorsConfig on this CPU build")
    fp8 = read_quantization({"quantization_config": FP8}, "config.json")
    assert fp8 is not None
    [item] = vllm_items(fp8, serving, platform="cpu", capability=None, serve_dtype="float32")
    assert item.result == "error" and item.fix == "set dtype: bfloat16 in the run config"
    assert "Fp8Config computes in bfloat16, half only (get_supported_act_dtypes); the server would compute in " \
           "float32" in item.why


@needs_vllm_source
def test_gpu_hardware_is_judged_by_each_config_class_minimum_capability() -> None:
    """Read as for a GPU host: FP8 needs 7.5 (Fp8Config), NVFP4 as ModelOpt publishes it becomes vLLM's
    modelopt_fp4 (override_quantization_method) and is served on a Hopper GPU (9.0)."""
    serving = ModuleIndex(VLLM_SITES)
    fp8 = read_quantization({"quantization_config": FP8}, "config.json")
    nvfp4 = read_quantization({"quantization_config": NVFP4}, "config.json")
    assert fp8 is not None and nvfp4 is not None
    [old] = vllm_items(fp8, serving, platform="gpu", capability=70, serve_dtype="bfloat16")
    assert old.result == "error" and "needs compute capability >= 7.5 (get_min_capability); this host's GPUs are " \
        "7.0" in old.why
    [hopper] = vllm_items(nvfp4, serving, platform="gpu", capability=90, serve_dtype="bfloat16")
    assert hopper.result == "ok"
    assert hopper.why.startswith("modelopt NVFP4 (vLLM method modelopt_fp4): vLLM 0.32.0 serves it through "
                                 "ModelOptNvFp4Config on GPUs of compute capability 9.0")
