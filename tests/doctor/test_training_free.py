"""The doctor's reading of vLLM's training-free speculators (ngram, suffix) in the serve env, before any load:
which methods the installed vLLM offers (its SpeculativeMethod) and what each one's validation checks for."""

from __future__ import annotations

import shutil
from pathlib import Path

from specops.analysis import ModuleIndex
from specops.doctor import training_free_support
from specops.doctor._training_free import training_free_items
from tests.support.vllm import VLLM_PYTHON, needs_vllm

SERVE_SITE = next((VLLM_PYTHON.parent.parent / "lib").glob("python3*/site-packages"), None) if VLLM_PYTHON.exists() \
    else None


def _vllm_copy(root: Path) -> Path:
    """The serve env's vllm/config/speculative.py and vllm/utils/import_utils.py, as a source tree of their own."""
    for relative in ("vllm/__init__.py", "vllm/config/__init__.py", "vllm/config/speculative.py",
                     "vllm/utils/__init__.py", "vllm/utils/import_utils.py"):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SERVE_SITE / relative, root / relative)
    return root


@needs_vllm
def test_the_cpu_build_serves_ngram_and_names_what_suffix_lacks(tmp_path: Path) -> None:
    # the serve env's own vLLM files without arctic_inference beside them (scripts/setup-suffix.sh may have put it in
    # the serve env itself)
    support = training_free_support([str(_vllm_copy(tmp_path / "site"))])
    assert support["ngram"].servable is True
    suffix = support["suffix"]
    assert suffix.servable is False
    assert "arctic_inference" in suffix.why and "has_arctic_inference()" in suffix.why
    assert suffix.fix.startswith("pip install arctic-inference==")  # vLLM's own words, read from its ImportError


@needs_vllm
def test_suffix_is_servable_where_its_module_is_installed(tmp_path: Path) -> None:
    root = _vllm_copy(tmp_path / "site")
    (root / "arctic_inference").mkdir()
    (root / "arctic_inference" / "__init__.py").write_text("")  # found on the path; the doctor imports nothing
    assert training_free_support([str(root)])["suffix"].servable is True


@needs_vllm
def test_the_settings_a_method_takes_are_the_fields_the_release_declares(tmp_path: Path) -> None:
    root = _vllm_copy(tmp_path / "site")
    (root / "arctic_inference").mkdir()
    (root / "arctic_inference" / "__init__.py").write_text("")
    setting = "suffix_decoding_max_cached_requests"  # evaluate --compare turns suffix decoding's global tree off
    assert setting in training_free_support([str(root)])["suffix"].settings
    source = root / "vllm/config/speculative.py"
    source.write_text(source.read_text().replace(f"    {setting}: int", "    renamed_in_a_later_release: int", 1))
    suffix = training_free_support([str(root)])["suffix"]
    assert suffix.servable is True and setting not in suffix.settings
    assert "renamed_in_a_later_release" in suffix.settings


@needs_vllm
def test_a_release_without_the_method_says_so(tmp_path: Path) -> None:
    root = _vllm_copy(tmp_path / "site")
    source = root / "vllm/config/speculative.py"
    source.write_text(source.read_text().replace('    "suffix",\n', "", 1))
    suffix = training_free_support([str(root)])["suffix"]
    assert suffix.servable is False and "offers no speculative method 'suffix'" in suffix.why


@needs_vllm
def test_the_serve_env_is_judged_by_what_it_holds() -> None:
    suffix = training_free_support([str(SERVE_SITE)])["suffix"]
    assert suffix.servable is (SERVE_SITE / "arctic_inference" / "__init__.py").is_file()


def test_an_env_without_vllm_is_unknown_not_ok(tmp_path: Path) -> None:
    items = training_free_items(ModuleIndex([str(tmp_path)]))
    assert [item.result for item in items] == ["unknown", "unknown"]


@needs_vllm
def test_the_doctor_lines_warn_for_suffix_only(tmp_path: Path) -> None:
    items = {item.where: item for item in training_free_items(ModuleIndex([str(_vllm_copy(tmp_path / "site"))]))}
    assert items["vllm/config/speculative.py (ngram)"].result == "ok"
    suffix = items["vllm/config/speculative.py (suffix)"]
    assert suffix.result == "warn" and "evaluate --compare" in suffix.why
