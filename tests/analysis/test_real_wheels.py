"""The API contract of real speculators wheels against the real vLLM 0.16.0 source."""

from __future__ import annotations

from pathlib import Path

import pytest

from specops.analysis import Finding, ModuleIndex, check_calls, check_imports, check_package

pytestmark = pytest.mark.wheels

GENERATOR = "speculators/data_generation/vllm_hidden_states_generator.py"
WORKER = "speculators/data_generation/custom_worker.py"


def errors(findings: list[Finding]) -> dict[tuple[str, int], Finding]:
    return {(Path(f.file).name, f.line): f for f in findings if f.status == "error"}


def generator_calls(site: Path) -> list[Finding]:
    index = ModuleIndex([str(site)])
    return [f for file in (GENERATOR, WORKER) for f in check_calls(site / file, index, packages={"vllm"})]


def test_speculators_030_breaks_against_vllm_016_are_reported_with_file_and_line(site_030: Path) -> None:
    found = errors(generator_calls(site_030))
    generator = "vllm_hidden_states_generator.py"
    assert set(found) == {(generator, 136), (generator, 148), (generator, 194)}
    kv = found[(generator, 136)]
    assert kv.callee == "vllm.v1.core.kv_cache_utils.get_kv_cache_config_from_groups"
    assert kv.detail.startswith("unexpected keyword 'kv_cache_specs'; ")
    assert "(vllm_config, kv_cache_groups, available_memory) at vllm/v1/core/kv_cache_utils.py:1069" in kv.detail
    assert kv.file == str((site_030 / GENERATOR).resolve())
    scheduler = found[(generator, 148)]
    assert scheduler.callee == "vllm.v1.core.sched.scheduler.Scheduler"
    assert "missing required parameter 'block_size'" in scheduler.detail
    config = found[(generator, 194)]
    assert config.callee == "vllm.config.scheduler.SchedulerConfig"
    assert "missing required parameter 'is_encoder_decoder'" in config.detail
    assert "max_model_len" not in config.detail.split(";")[0]  # that InitVar is passed


def test_the_calls_speculators_0401_fixed_bind_against_vllm_016(site_0401: Path) -> None:
    findings = generator_calls(site_0401)
    by_callee = {f.callee: f.status for f in findings}
    for fixed in ("vllm.v1.core.kv_cache_utils.get_kv_cache_config_from_groups",
                  "vllm.v1.core.sched.scheduler.Scheduler", "vllm.config.scheduler.SchedulerConfig"):
        assert by_callee[fixed] == "ok"
    assert errors(findings) == {}


def test_every_import_into_vllm_of_both_versions_resolves(site_030: Path, site_0401: Path) -> None:
    for site in (site_030, site_0401):
        index = ModuleIndex([str(site)])
        findings = [f for file in (GENERATOR, WORKER) for f in check_imports(site / file, index)
                    if f.callee.startswith("vllm")]
        assert findings and all(f.status == "ok" for f in findings), [f for f in findings if f.status != "ok"]


def test_whole_package_check_finds_only_the_real_breaks(site_030: Path) -> None:
    findings = check_package("speculators", ModuleIndex([str(site_030)]), into={"vllm"})
    assert sorted(line for _, line in errors(findings)) == [136, 148, 194]


def test_check_calls_on_two_files_parses_only_what_they_call_into(site_030: Path) -> None:
    index = ModuleIndex([str(site_030)])
    check_calls(site_030 / GENERATOR, index, packages={"vllm"})
    check_calls(site_030 / WORKER, index, packages={"vllm"})
    parsed = [path for path, tree in index._trees.items() if tree is not None]
    assert len(parsed) < 60, len(parsed)  # of vLLM's 1,359 files
