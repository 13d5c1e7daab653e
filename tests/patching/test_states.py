"""The states a patch can be found in after apply, each told apart in verify's `state` check and in status."""

from __future__ import annotations

import shutil

import pytest

from tests.patching.conftest import SET_NAME, WORKER, Host
from tests.support.wheels import fetch_wheel, unpack_into

pytestmark = pytest.mark.wheels

GENERATOR_PATCHES = {"tokenizer-trust-remote-code", "scheduler-config-is-encoder-decoder",
                     "kv-cache-config-without-specs", "scheduler-block-size"}
WORKER_PATCHES = {"worker-multimodal-language-model", "worker-embed-input-ids",
                  "worker-capture-without-eagle3-interface"}


def state_checks(document: dict) -> dict[str, dict]:
    return {c["patch"]: c for c in document["checks"] if c["check"] == "state"}


def status_lines(host: Host) -> dict[str, str]:
    code, document = host.agent("status", "--set", SET_NAME)
    assert code == 0, document
    return {line.split(":", 1)[0].split()[-1]: line for line in document["lines"]}


def install_speculators_0401_over(host: Host) -> None:
    """What `pip install speculators==0.4.0.1` does to the site: new files, the old dist-info gone."""
    shutil.rmtree(host.site / "speculators-0.3.0.dist-info")
    unpack_into(fetch_wheel("speculators", "0.4.0.1"), host.site)


def test_a_patch_file_edited_after_apply_is_stale_and_apply_again_clears_it(host: Host) -> None:
    host.agent("apply")
    spec = host.patches / "06-worker-embed-input-ids.toml"
    spec.write_text(spec.read_text().replace('reason = "', 'reason = "(edited) ', 1))

    code, document = host.agent("verify", "--set", SET_NAME)
    lines = status_lines(host)

    states = state_checks(document)
    assert code == 1
    assert {states[p]["status"] for p in WORKER_PATCHES} == {"stale"}
    assert {states[p]["status"] for p in GENERATOR_PATCHES} == {"applied"}
    assert states["worker-embed-input-ids"]["ok"] is False
    assert states["worker-embed-input-ids"]["detail"] == (
        "applied, but the patch spec changed since; apply again: 06-worker-embed-input-ids.toml changed since apply")
    assert "patch spec changed since; apply again" in lines["worker-embed-input-ids"]
    assert "stale" not in lines["tokenizer-trust-remote-code"] and ": applied;" in lines["tokenizer-trust-remote-code"]

    code, applied = host.agent("apply")
    assert (code, applied["sets"][0]["result"]) == (0, "applied")
    assert set(host.states().values()) == {"applied"}


def test_another_version_installed_over_the_patched_files_is_upstream_changed(host: Host) -> None:
    host.agent("apply")
    install_speculators_0401_over(host)

    code, document = host.agent("verify", "--set", SET_NAME)
    lines = status_lines(host)

    states = state_checks(document)
    assert code == 1
    assert {states[p]["status"] for p in GENERATOR_PATCHES | WORKER_PATCHES} == {"upstream-changed"}
    detail = states["worker-embed-input-ids"]["detail"]
    assert detail == "file is speculators 0.4.0.1's original, applied against 0.3.0's"
    assert "upstream file changed" in lines["worker-embed-input-ids"]
    assert "speculators 0.4.0.1 (wants ==0.3.0)" in lines["worker-embed-input-ids"]
    [versions] = [c for c in document["checks"] if c["check"] == "versions"]
    assert versions["ok"] is False and "installed speculators 0.4.0.1, set wants ==0.3.0" in versions["detail"]


def test_a_file_changed_along_with_the_package_version_is_upstream_changed_not_hand_edited(host: Host) -> None:
    host.agent("apply")
    worker = host.file(WORKER)
    worker.write_text(worker.read_text() + "# shipped by a local build\n")
    dist_info = host.site / "speculators-0.3.0.dist-info"
    metadata = dist_info / "METADATA"
    metadata.write_text(metadata.read_text().replace("Version: 0.3.0\n", "Version: 0.3.1\n", 1))
    dist_info.rename(host.site / "speculators-0.3.1.dist-info")

    code, document = host.agent("verify", "--set", SET_NAME)
    lines = status_lines(host)

    states = state_checks(document)
    assert code == 1
    assert {states[p]["status"] for p in WORKER_PATCHES} == {"upstream-changed"}
    assert states["worker-embed-input-ids"]["detail"].endswith(
        "matches neither the patched image, the pristine image nor speculators 0.3.1's RECORD; "
        "speculators went from 0.3.0 to 0.3.1 since apply")
    assert "upstream file changed" in lines["worker-embed-input-ids"]
    # the generator, untouched, still carries the patch: its state is not confused with the worker's
    assert {states[p]["status"] for p in GENERATOR_PATCHES} == {"applied"}


def test_the_same_edit_without_a_version_change_is_hand_edited(host: Host) -> None:
    host.agent("apply")
    worker = host.file(WORKER)
    worker.write_text(worker.read_text() + "# shipped by a local build\n")

    code, document = host.agent("verify", "--set", SET_NAME)

    states = state_checks(document)
    assert code == 1
    assert {states[p]["status"] for p in WORKER_PATCHES} == {"hand-edited"}
    assert states["worker-embed-input-ids"]["detail"].endswith(
        "matches neither the patched image, the pristine image nor speculators 0.3.0's RECORD; "
        "speculators is still 0.3.0: hand-edited since apply")
    assert "hand-edited since apply" in status_lines(host)["worker-embed-input-ids"]
