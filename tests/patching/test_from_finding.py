"""`patch new --from-finding ID`: a doctor finding on the throwaway speculators 0.3.0 host becomes a patch
file that replays, applies, verifies, and leaves the doctor without that finding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.patching.conftest import GENERATOR, REPO, Host

pytestmark = pytest.mark.wheels

PROPOSED = "speculators-0.3.0-proposed"


def doctor_errors(host: Host, cache: Path) -> dict[str, dict]:
    env = {**os.environ, "SPECOPS_WORKDIR": str(host.workdir), "SPECOPS_ANALYSIS_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join([str(host.site), str(host.vllm_site), str(REPO / "src")])}
    result = subprocess.run([sys.executable, "-m", "specops", "doctor", "--checks", "api"], cwd=host.workdir,
                            env=env, capture_output=True, text=True, timeout=300)
    document = json.loads(result.stdout)
    return {f["where"].rsplit("/", 1)[-1]: f for f in document["findings"] if f["result"] == "error"}


def new_set(host: Host) -> Path:
    folder = host.workdir / "patches" / PROPOSED
    folder.mkdir(parents=True)
    (folder / "set.toml").write_text('package = "speculators"\nversion = "==0.3.0"\n\n'
                                     '[requires]\nvllm = ">=0.12,<0.17"\n')
    return folder


def test_the_kv_cache_specs_finding_becomes_a_patch_that_applies_and_verifies(
        host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECOPS_ANALYSIS_CACHE", str(tmp_path / "cache"))
    folder = new_set(host)
    finding = doctor_errors(host, tmp_path / "cache")["vllm_hidden_states_generator.py:136"]

    code, document = host.agent("new", "--from-finding", finding["id"], "--set", PROPOSED)

    assert code == 0 and document["ok"] is True and document["bound"] is True, document
    assert document["id"] == "drop-kv-cache-specs" and document["placeholders"] == 0
    written = Path(document["written"])
    assert written == folder / "01-drop-kv-cache-specs.toml"
    patch = tomllib.loads(written.read_text())
    assert patch["module"] == "speculators.data_generation.vllm_hidden_states_generator"
    [replace] = patch["replace"]
    assert "kv_cache_specs=kv_cache_spec" in replace["old"] and "kv_cache_specs" not in replace["new"]
    assert "-            kv_cache_specs=kv_cache_spec,\n" in document["proposed_diff"]
    assert "kv_cache_specs" in host.file(GENERATOR).read_text()  # proposing writes nothing to the package

    code, applied = host.agent("apply", "--set", PROPOSED)
    assert code == 0 and applied["ok"] is True, applied
    after = doctor_errors(host, tmp_path / "cache")
    assert "vllm_hidden_states_generator.py:136" not in after
    # verify binds every call of the patched file: the file's two other breaks (one line up now) still
    # fail it, so they get their patches from their findings too, and then the set verifies
    _, verified = host.agent("verify", "--set", PROPOSED)
    failing = {f["line"] for c in verified["checks"] if c["check"] == "calls_bind" for f in c.get("findings", [])
               if f["status"] == "error"}
    assert failing == {147, 193}
    for line in (147, 193):
        code, more = host.agent("new", "--from-finding", after[f"vllm_hidden_states_generator.py:{line}"]["id"],
                                "--set", PROPOSED)
        assert code == 0 and more["bound"] is True, more
    assert host.agent("apply", "--set", PROPOSED)[0] == 0
    code, verified = host.agent("verify", "--set", PROPOSED)
    assert code == 0 and verified["ok"] is True, verified


def test_a_missing_argument_is_read_off_self_or_left_as_a_marked_placeholder(
        host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECOPS_ANALYSIS_CACHE", str(tmp_path / "cache"))
    new_set(host)
    errors = doctor_errors(host, tmp_path / "cache")

    _, block = host.agent("new", "--from-finding", errors["vllm_hidden_states_generator.py:148"]["id"],
                          "--set", PROPOSED)
    _, encoder = host.agent("new", "--from-finding", errors["vllm_hidden_states_generator.py:194"]["id"],
                            "--set", PROPOSED)

    assert "+            block_size=self.vllm_config.cache_config.block_size,\n" in block["proposed_diff"]
    assert block["placeholders"] == 0
    # while the config is being built there is no self.vllm_config yet: nothing to derive it from
    assert "is_encoder_decoder=None,  # specops: placeholder" in encoder["proposed_diff"]
    assert encoder["placeholders"] == 1 and encoder["ok"] is True


def test_an_unknown_finding_id_is_bad_input(host: Host) -> None:
    new_set(host)
    code, document = host.agent("new", "--from-finding", "api-0000000000", "--set", PROPOSED)
    assert code == 2 and document["error"].startswith("--from-finding api-0000000000: no such finding")


def test_names_that_moved_are_imported_from_where_they_went_in_one_patch(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.analysis.sites import unpacked_site

    site = unpacked_site(tmp_path_factory, ("speculators", "0.4.0.1"), ("vllm", "0.33.0"))
    workdir = tmp_path / "work"
    (workdir / "patches" / "s").mkdir(parents=True)
    (workdir / "patches" / "s" / "set.toml").write_text('package = "speculators"\nversion = "==0.4.0.1"\n')
    env = {**os.environ, "SPECOPS_WORKDIR": str(workdir), "SPECOPS_ANALYSIS_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(site), str(REPO / "src")])}

    def agent(*args: str) -> tuple[int, dict]:
        result = subprocess.run([sys.executable, "-m", "specops", *args], cwd=workdir, env=env,
                                capture_output=True, text=True, timeout=300)
        return result.returncode, json.loads(result.stdout)

    _, report = agent("doctor", "--checks", "api")
    [first, *_] = [f for f in report["findings"] if f["result"] == "error" and "has no name" in f["why"]]
    code, document = agent("patch", "new", "--from-finding", first["id"], "--set", "s")

    assert code == 0 and document["bound"] is True, document
    assert document["id"] == "import-moved-from-kv-cache-planning"
    diff = document["proposed_diff"]
    assert "+from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash\n" in diff
    assert "+from vllm.v1.core.kv_cache_planning import (\n" in diff
    assert agent("patch", "apply", "--set", "s")[0] == 0
    _, after = agent("doctor", "--checks", "api")
    assert not [f for f in after["findings"] if f["result"] == "error" and "has no name" in f["why"]]
