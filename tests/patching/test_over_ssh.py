"""`invoke patch ...` end to end: the real tasks, over the real sshd and on `local`, against real wheels.

The test host's python is a wrapper that puts a copy of speculators 0.3.0 and vLLM 0.16.0 first on
its path, exactly as if they were installed in the host's ML env.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ssh_host
from tests.patching.conftest import GENERATOR, SET_NAME, wheel_member
from tests.support.cli import Cli, write_inventory

pytestmark = [pytest.mark.ssh, pytest.mark.wheels]


@pytest.fixture
def patch_cli(tmp_path: Path, sshd, known_hosts: Path, wheel_sites: tuple[Path, Path], host_name: str):
    speculators_site, vllm_site = wheel_sites
    site = tmp_path / "site"
    shutil.copytree(speculators_site, site)
    python = tmp_path / "host-python"
    path = f"{site}:{vllm_site}${{PYTHONPATH:+:$PYTHONPATH}}"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={path} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    hosts = {
        "local": {"connection": "local", "workdir": str(tmp_path / "local-wd"), "python": str(python)},
        "loop": ssh_host(known_hosts=known_hosts, sshd=sshd, workdir=tmp_path / "loop-wd", python=str(python)),
    }
    inventory = write_inventory(tmp_path / "inventory.yaml", hosts, default=host_name)
    return Cli(inventory, tmp_path / "logs"), site


def test_the_whole_patch_lifecycle_through_invoke(patch_cli) -> None:
    cli, site = patch_cli
    generator = site / GENERATOR
    pristine = wheel_member("speculators", "0.3.0", GENERATOR)

    before = cli("patch", "verify", "--set", SET_NAME, "--json")
    assert before.exit_code == 1
    failing = [check for check in before.json()["checks"] if not check["ok"]]
    details = " ".join(check["detail"] for check in failing)
    assert "kv_cache_specs" in details and "is_encoder_decoder" in details

    applied = cli("patch", "apply", "--set", SET_NAME, "--json")
    assert applied.exit_code == 0, applied.stdout + applied.stderr
    assert applied.json()["sets"][0]["result"] == "applied"
    again = cli("patch", "apply", "--set", SET_NAME, "--json")
    assert again.json()["sets"][0]["result"] == "already applied"

    started = time.perf_counter()
    verified = cli("patch", "verify", "--set", SET_NAME, "--json")
    elapsed = time.perf_counter() - started
    document = verified.json()
    assert verified.exit_code == 0, json.dumps(document["checks"], indent=1)[:3000]
    assert document["ok"] is True and all(check["ok"] for check in document["checks"])
    assert all({"ok", "detail"} <= set(check) for check in document["checks"])
    assert document["round_trips"] == 1
    print(f"\npatch verify through invoke: {elapsed:.2f} s wall, {document['round_trips']} round trip")

    generator.write_text(generator.read_text() + "\n# tweaked by hand\n")
    drifted = cli("patch", "verify", "--set", SET_NAME, "--json")
    assert drifted.exit_code == 1
    failing_states = [check for check in drifted.json()["checks"] if check["check"] == "state" and not check["ok"]]
    assert failing_states and all("hand-edited" in json.dumps(check) for check in failing_states), drifted.stdout

    generator.write_text(generator.read_text().replace("\n# tweaked by hand\n", ""))
    reverted = cli("patch", "revert", "--set", SET_NAME, "--json")
    assert reverted.exit_code == 0, reverted.stdout
    assert generator.read_bytes() == pristine


def test_human_verify_prints_a_table_and_fails_on_the_pristine_tree(patch_cli) -> None:
    cli, _site = patch_cli
    result = cli("patch", "verify", "--set", SET_NAME)
    assert result.exit_code == 1
    assert "calls_bind" in result.stdout and "FAIL" in result.stdout


def test_an_unknown_action_is_bad_input(patch_cli) -> None:
    cli, _site = patch_cli
    result = cli("patch", "frobnicate")
    assert result.exit_code == 2 and "unknown action" in result.stderr


def test_patch_new_writes_a_reviewable_patch_into_this_checkout(patch_cli, tmp_path: Path) -> None:
    import tomllib

    cli, site = patch_cli
    installed = site / GENERATOR
    edited = tmp_path / "edited.py"
    edited.write_text(installed.read_text().replace(
        "AutoTokenizer.from_pretrained(model_path)", "AutoTokenizer.from_pretrained(model_path, use_fast=True)"))
    local_patches = tmp_path / "checkout-patches"
    module = "speculators.data_generation.vllm_hidden_states_generator"
    result = cli("patch", "new", "--set", SET_NAME, "--module", module, "--edited", str(edited), "--id", "fast-tok",
                 "--reason", "use the fast tokenizer", "--json", SPECOPS_PATCHES_DIR=str(local_patches))
    assert result.exit_code == 0, result.stdout + result.stderr
    written = Path(result.json()["written_here"])
    assert written.parent == local_patches / SET_NAME and written.name.endswith("-fast-tok.toml")
    spec = tomllib.loads(written.read_text())
    assert spec["id"] == "fast-tok" and spec["module"] == module
    assert any("use_fast=True" in replace["new"] for replace in spec["replace"])
    assert installed.read_text() != edited.read_text()  # nothing on the host was patched by `new`
