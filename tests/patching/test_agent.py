"""`python -m specops patch ...` against real speculators 0.3.0 and vLLM 0.16.0 sources."""

from __future__ import annotations

import re

import pytest

from tests.patching.conftest import GENERATOR, SET_NAME, WORKER, Host, tree_digest, wheel_member

pytestmark = pytest.mark.wheels

ALL_PATCHES = {
    "tokenizer-trust-remote-code", "scheduler-config-is-encoder-decoder", "kv-cache-config-without-specs",
    "scheduler-block-size", "worker-multimodal-language-model", "worker-embed-input-ids",
    "worker-capture-without-eagle3-interface",
}


def check(document: dict, name: str, target_suffix: str) -> dict:
    [found] = [c for c in document["checks"] if c["check"] == name and (c["target"] or "").endswith(target_suffix)]
    return found


def test_verify_on_the_pristine_tree_names_each_real_breakage(host: Host) -> None:
    code, document = host.agent("verify")

    assert code == 1 and document["ok"] is False
    calls = check(document, "calls_bind", "vllm_hidden_states_generator")
    assert calls["ok"] is False
    errors = {(f["line"], f["callee"].rsplit(".", 1)[-1]): f["detail"]
              for f in calls["findings"] if f["status"] == "error"}
    assert set(errors) == {(136, "get_kv_cache_config_from_groups"), (148, "Scheduler"), (194, "SchedulerConfig")}
    assert "unexpected keyword 'kv_cache_specs'" in errors[136, "get_kv_cache_config_from_groups"]
    assert "missing required parameter 'block_size'" in errors[148, "Scheduler"]
    assert "missing required parameter 'is_encoder_decoder'" in errors[194, "SchedulerConfig"]
    assert f"{GENERATOR}:136" in calls["detail"]
    states = {c["patch"]: c["status"] for c in document["checks"] if c["check"] == "state"}
    assert states == dict.fromkeys(ALL_PATCHES, "not-applied")
    assert check(document, "versions", "speculators")["ok"] is True


def test_apply_then_verify_passes(host: Host) -> None:
    code, applied = host.agent("apply")
    assert (code, applied["sets"][0]["result"]) == (0, "applied")

    code, document = host.agent("verify")

    failed = [c for c in document["checks"] if not c["ok"]]
    assert (code, failed) == (0, [])
    assert {c["patch"] for c in document["checks"] if c["check"] == "state"} == ALL_PATCHES
    assert {c["check"] for c in document["checks"]} == {"versions", "state", "parses", "calls_bind",
                                                         "imports_resolve"}


def test_apply_writes_the_patched_text_and_drops_stale_bytecode(host: Host) -> None:
    cache = host.file(WORKER).parent / "__pycache__"
    cache.mkdir()
    stale = cache / "custom_worker.cpython-311.pyc"
    stale.write_bytes(b"stale")

    code, _ = host.agent("apply")

    assert code == 0
    assert not stale.exists()
    generator = host.file(GENERATOR).read_text()
    assert "AutoTokenizer.from_pretrained(model_path, trust_remote_code=True)" in generator
    assert "kv_cache_specs=" not in generator
    assert "self.embed_input_ids(input_ids)" in host.file(WORKER).read_text()


def test_applying_twice_changes_nothing_and_says_so(host: Host) -> None:
    host.agent("apply")
    before = tree_digest(host.site, host.workdir)

    code, document = host.agent("apply")

    assert code == 0
    assert document["sets"][0]["result"] == "already applied"
    assert {p["result"] for p in document["sets"][0]["patches"]} == {"already applied"}
    assert tree_digest(host.site, host.workdir) == before


def test_revert_is_byte_identical_to_the_wheel(host: Host) -> None:
    host.agent("apply")

    code, document = host.agent("revert")

    assert (code, document["sets"][0]["result"]) == (0, "reverted")
    for relative in (GENERATOR, WORKER):
        assert host.file(relative).read_bytes() == wheel_member("speculators", "0.3.0", relative)
    assert set(host.states().values()) == {"not-applied"}
    assert not (host.site / ".specops-patches" / SET_NAME / "record.json").exists()


def test_a_hand_edit_after_apply_is_drift_and_blocks_apply_and_revert(host: Host) -> None:
    host.agent("apply")
    worker = host.file(WORKER)
    worker.write_text(worker.read_text() + "# local tweak\n")
    before = tree_digest(host.site, host.workdir)

    states = host.states()
    apply_code, applied = host.agent("apply")
    revert_code, reverted = host.agent("revert")

    assert {states[p] for p in ALL_PATCHES if p.startswith("worker-")} == {"hand-edited"}
    assert states["tokenizer-trust-remote-code"] == "applied"
    assert apply_code == 1 and "hand-edited since apply" in applied["sets"][0]["detail"]
    assert revert_code == 1 and "hand-edited since apply" in reverted["sets"][0]["detail"]
    assert tree_digest(host.site, host.workdir) == before


def test_a_reinstalled_package_reads_as_patch_gone_and_apply_restores_it(host: Host) -> None:
    host.agent("apply")
    host.file(WORKER).write_bytes(wheel_member("speculators", "0.3.0", WORKER))

    code, document = host.agent("status")
    worker_patches = [p for p in document["sets"][0]["patches"] if p["id"].startswith("worker-")]
    assert {(p["state"], p["detail"]) for p in worker_patches} == {("reinstalled", "package reinstalled, patch gone")}
    assert any("package reinstalled, patch gone" in line for line in document["lines"])

    code, _ = host.agent("apply")
    assert code == 0 and set(host.states().values()) == {"applied"}


def test_a_missing_anchor_is_refused_and_nothing_is_written(host: Host) -> None:
    spec = host.patches / "04-scheduler-block-size.toml"
    spec.write_text(spec.read_text().replace("structured_output_manager=structured_output_manager,\n        )",
                                             "structured_output_manager=som,\n        )", 1))
    before = tree_digest(host.site, host.workdir)

    code, document = host.agent("apply")

    assert code == 1
    entry = document["sets"][0]
    assert entry["result"] == "refused"
    assert entry["refusals"] == [f"{host.file(GENERATOR)}: replace[1] "
                                 "'structured_output_manager=som,' not found"]
    assert tree_digest(host.site, host.workdir) == before


def test_an_anchor_found_more_often_than_declared_is_refused_with_its_lines(host: Host) -> None:
    spec = host.patches / "01-tokenizer-trust-remote-code.toml"
    spec.write_text(spec.read_text().replace("count = 1", "count = 2"))
    before = tree_digest(host.site, host.workdir)

    code, document = host.agent("apply", "--set", SET_NAME)

    assert code == 1
    assert document["sets"][0]["refusals"] == [
        f"{host.file(GENERATOR)}: replace[1] 'self.tokenizer = AutoTokenizer.from_pretrained(model_path)' "
        "occurs 1 times (line 84), patch expects 2"]
    assert tree_digest(host.site, host.workdir) == before


def test_dry_run_shows_the_diff_and_writes_nothing(host: Host) -> None:
    before = tree_digest(host.site, host.workdir)

    code, document = host.agent("apply", "--dry-run")

    assert code == 0
    entry = document["sets"][0]
    assert entry["result"] == "would apply"
    assert "-        self.tokenizer = AutoTokenizer.from_pretrained(model_path)\n" in entry["diff"]
    assert "+            block_size=self.vllm_config.cache_config.block_size,\n" in entry["diff"]
    assert tree_digest(host.site, host.workdir) == before


@pytest.mark.parametrize(("file", "edit", "message"), [
    ("01-tokenizer-trust-remote-code.toml", lambda t: t + "[broken\n", "not valid TOML"),
    ("01-tokenizer-trust-remote-code.toml", lambda t: "colour = 'red'\n" + t, "unknown key 'colour'"),
    ("01-tokenizer-trust-remote-code.toml", lambda t: t.replace("count = 1", "count = '1'"),
     "key 'replace[1].count' must be a int, got str"),
    ("02-scheduler-config-is-encoder-decoder.toml",
     lambda t: t.replace('id = "scheduler-config-is-encoder-decoder"', 'id = "tokenizer-trust-remote-code"'),
     "key 'id': duplicate id 'tokenizer-trust-remote-code'"),
    ("06-worker-embed-input-ids.toml", lambda t: re.sub(r"new = '''.*?'''", "new = '''\n            else "
                                                       "self.get_input_embeddings(input_ids)\n'''", t, flags=re.S),
     "key 'replace[1].new' equals 'old'"),
    ("06-worker-embed-input-ids.toml", lambda t: re.sub(r"old = '''.*?'''", "old = ''", t, flags=re.S),
     "key 'replace[1].old' is empty"),
    ("set.toml", lambda t: t.replace('vllm = ">=0.12,<0.17"', 'vllm = ">=0.12,<<0.17"'),
     "key 'requires.vllm': not a version specifier: '<<0.17'"),
])
def test_a_corrupt_or_ambiguous_spec_is_rejected_in_one_line(host: Host, file: str, edit, message: str) -> None:
    spec = host.patches / file
    spec.write_text(edit(spec.read_text()))
    before = tree_digest(host.site)

    code, document = host.agent("apply")

    assert code == 2 and document["ok"] is False
    assert document["error"].startswith(f"{spec}: ")
    assert message in document["error"] and "\n" not in document["error"]
    assert tree_digest(host.site) == before


def test_a_version_mismatch_is_an_error_when_named_and_not_applicable_otherwise(host: Host) -> None:
    set_file = host.patches / "set.toml"
    set_file.write_text(set_file.read_text().replace('version = "==0.3.0"', 'version = "==0.4.0.1"'))
    before = tree_digest(host.site)

    named_code, named = host.agent("apply", "--set", SET_NAME)
    all_code, everything = host.agent("apply")

    assert named_code == 1
    assert named["sets"][0]["refusals"] == ["installed speculators 0.3.0, set wants ==0.4.0.1"]
    assert all_code == 0
    assert everything["sets"][0]["result"] == "not applicable"
    assert everything["sets"][0]["reason"] == "not applicable (installed speculators 0.3.0, set wants ==0.4.0.1)"
    assert tree_digest(host.site) == before


def test_new_writes_a_patch_that_reproduces_the_edited_copy(host: Host, tmp_path) -> None:
    host.agent("apply")
    edited = tmp_path / "custom_worker.py"
    original = host.file(WORKER).read_text()
    edited.write_text(original.replace("    if self._captured_states is None:\n            return None\n",
                                       "    if self._captured_states is None:\n            return []\n")
                      .replace('"""Custom worker extension for hidden states capture."""',
                               '"""Custom worker extension for hidden states capture (patched)."""'))

    code, document = host.agent("new", "--set", SET_NAME, "--module", "speculators.data_generation.custom_worker",
                                "--edited", str(edited), "--id", "empty-capture-list",
                                "--reason", "callers iterate the result")

    assert code == 0, document
    written = host.patches / "08-empty-capture-list.toml"
    assert (document["written"], document["replacements"]) == (str(written), 2)
    code, applied = host.agent("apply")
    assert code == 0 and applied["sets"][0]["result"] == "applied"
    assert host.file(WORKER).read_text() == edited.read_text()
