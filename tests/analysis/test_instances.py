"""Calls on instances, functions bound with types.MethodType, moved names and the engine loop: first on
small packages written here, then on the real speculators and vLLM wheels."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from specops.analysis import ModuleIndex, check_calls, check_imports
from specops.analysis._bound import check_bound_functions
from specops.analysis._engine_loop import check_engine_loop
from specops.analysis._instances import check_instance_calls


def installed(site: Path) -> ModuleIndex:
    """The wheel's site first, then this interpreter's path (torch's nn.Module, as on a host)."""
    return ModuleIndex([str(site), *sys.path])


GENERATOR = "speculators/data_generation/vllm_hidden_states_generator.py"
WORKER = "speculators/data_generation/custom_worker.py"


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


LIB = {
    "lib/__init__.py": "",
    "lib/sched.py": """
        class Sched:
            def __init__(self, size):
                self.size = size

            def schedule(self, budget):
                return budget


        def make() -> Sched:
            return Sched(1)
    """,
    "lib/planning.py": """
        def plan_groups(config, groups):
            return groups
    """,
    "lib/utils.py": "def unrelated():\n    pass\n",
    "app/__init__.py": "",
    "app/driver.py": """
        from lib.sched import Sched, make


        class Driver:
            def __init__(self):
                self.sched = Sched(4)
                self.maybe: Sched = make()

            def run(self):
                self.sched.schedule(8)
                self.sched.schedule()
                self.sched.plan()
                self.maybe.plan()
                return self.sched.size
    """,
    "app/old.py": """
        from lib.utils import plan_groups


        def go():
            return plan_groups(None, [])
    """,
}


def by_line(findings) -> dict[int, tuple[str, str]]:
    return {f.line: (f.status, f.detail) for f in findings}


def test_a_constructed_attribute_binds_its_methods_and_lacks_nothing_silently(tmp_path: Path) -> None:
    site = write(tmp_path, LIB)
    found = by_line(check_instance_calls(site / "app/driver.py", ModuleIndex([str(site)]), packages={"lib"}))

    assert found[11][0] == "ok"  # self.sched.schedule(8)
    assert found[12][0] == "error" and "missing required parameter 'budget'" in found[12][1]
    assert found[13][0] == "error" and "Sched (lib/sched.py:2) has no attribute 'plan'" in found[13][1]
    # typed from an annotation only: a subclass may have it, so not an error
    assert found[14][0] == "unknown" and "a subclass or mixin may" in found[14][1]
    assert found[15][0] == "ok"  # self.sched.size, assigned in Sched.__init__


def test_a_missing_name_says_where_it_moved(tmp_path: Path) -> None:
    site = write(tmp_path, LIB)
    index = ModuleIndex([str(site)])

    [imported] = [f for f in check_imports(site / "app/old.py", index) if f.callee.endswith("plan_groups")]
    [called] = [f for f in check_calls(site / "app/old.py", index, packages={"lib"})]

    assert imported.status == "error" and "moved to lib.planning (lib/planning.py:2)" in imported.detail
    assert called.status == "error" and "moved to lib.planning (lib/planning.py:2)" in called.detail


@pytest.mark.wheels
def test_speculators_0401_calls_through_scheduler_and_executor_bind_against_vllm_016(site_0401: Path) -> None:
    findings = check_instance_calls(site_0401 / GENERATOR, installed(site_0401), packages={"vllm"})
    calls = [f for f in findings if f.kind == "call" and f.code.startswith(("self.scheduler.", "self.executor."))]

    assert len(calls) == 12
    assert all(f.status == "ok" for f in calls), [f for f in calls if f.status != "ok"]
    assert {f.callee for f in calls} >= {"vllm.v1.core.sched.scheduler.Scheduler.schedule",
                                         "vllm.v1.executor.multiproc_executor.MultiprocExecutor.sample_tokens"}


@pytest.mark.wheels
def test_the_forward_bound_onto_each_decoder_finds_the_embed_input_ids_rename(site_030: Path, site_0401: Path
                                                                              ) -> None:
    families = ["LlamaForCausalLM", "DeepseekV3ForCausalLM"]
    old = check_bound_functions(site_030 / WORKER, installed(site_030), families)
    renamed = [f for f in old if f.status == "error"]

    assert sorted((f.line, f.detail.split("]")[0]) for f in renamed) == [
        (30, "[DeepseekV3ForCausalLM"), (30, "[LlamaForCausalLM")]
    assert all("has no attribute 'get_input_embeddings'" in f.detail
               and "renamed with the same signature? embed_input_ids" in f.detail for f in renamed)
    assert "self is DeepseekV2Model" in next(f.detail for f in renamed if "Deepseek" in f.detail)

    fixed = check_bound_functions(site_0401 / WORKER, installed(site_0401), families)
    assert [f for f in fixed if f.status != "ok"] == []
    assert any(f.code == "self.embed_input_ids(input_ids)" for f in fixed)


@pytest.mark.wheels
def test_a_multimodal_wrapper_is_followed_to_its_decoder_through_vllms_registry(site_030: Path,
                                                                                 site_0401: Path) -> None:
    wrapper = ["KimiK25ForConditionalGeneration"]
    old = [f for f in check_bound_functions(site_030 / WORKER, installed(site_030), wrapper)
           if f.status != "ok"]

    assert [(f.line, f.status) for f in old] == [(107, "error"), (30, "error")]
    assert "KimiK25ForConditionalGeneration (vllm/model_executor/models/kimi_k25.py:309) has no attribute " \
           "'model'" in old[0].detail
    assert "keeps it at language_model.model (DeepseekV2Model" in old[0].detail

    # 0.4.0.1 asks the wrapper for get_language_model(): the decoder it reaches has every name used
    fixed = check_bound_functions(site_0401 / WORKER, installed(site_0401), wrapper)
    assert fixed and [f for f in fixed if f.status != "ok"] == []


@pytest.mark.wheels
def test_the_engine_loop_read_from_vllm_016_catches_the_skipped_sample_tokens(site_030: Path,
                                                                               site_0401: Path) -> None:
    old = check_engine_loop(site_030 / GENERATOR, installed(site_030))
    assert {(s.step.method, s.status) for s in old} == {
        ("sample_tokens", "error"), ("get_grammar_bitmask", "warn"), ("update_from_output", "warn")}
    error = next(s for s in old if s.status == "error")
    assert error.line == 253 and "vllm/v1/engine/core.py:389" in error.detail
    assert "self.model_executor.sample_tokens(grammar_output)` at line 413" in error.detail

    fixed = check_engine_loop(site_0401 / GENERATOR, installed(site_0401))
    assert {s.status for s in fixed} == {"warn"}


def test_a_function_assigned_onto_a_class_is_checked_with_self_as_that_class(tmp_path: Path) -> None:
    from specops.analysis._bound import check_assigned_functions

    site = write(tmp_path, {**LIB, "app/hook.py": """
        from lib.sched import Sched


        def patched(self, budget):
            self.schedule(budget)
            self.schedule()
            return self.size + self.extra


        Sched.schedule_twice = patched
    """})
    findings = check_assigned_functions(site / "app/hook.py", ModuleIndex([str(site)]))
    found = {f.code: (f.status, f.detail) for f in findings}

    assert found["self.schedule(budget)"][0] == "ok"
    assert found["self.schedule()"][0] == "error"
    assert "missing required parameter 'budget'" in found["self.schedule()"][1]
    assert "self is Sched" in found["self.schedule()"][1]
    assert found["self.size"][0] == "ok"
    assert found["self.extra"][0] == "unknown"  # a subclass of Sched may have it


def test_names_set_with_setattr_exist_and_a_computed_setattr_makes_every_name_unknown(tmp_path: Path) -> None:
    site = write(tmp_path, {
        "lib/__init__.py": "",
        "lib/things.py": """
            class Frozen:
                def __init__(self):
                    object.__setattr__(self, "size", 1)


            class Loose:
                def __init__(self, names):
                    for name in names:
                        setattr(self, name, None)
        """,
        "app/__init__.py": "",
        "app/use.py": """
            from lib.things import Frozen, Loose


            class User:
                def __init__(self):
                    self.frozen = Frozen()
                    self.loose = Loose(["a"])

                def run(self):
                    return self.frozen.size, self.frozen.colour, self.loose.a
        """,
    })
    found = {f.code: f.status for f in check_instance_calls(site / "app/use.py", ModuleIndex([str(site)]),
                                                             packages={"lib"})}

    assert found == {"self.frozen.size": "ok", "self.frozen.colour": "error", "self.loose.a": "unknown"}
