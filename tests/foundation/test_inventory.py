"""A malformed inventory is one clear line naming the file, the host and the key; exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import Cli

GOOD_HOST = "    connection: local\n    workdir: wd\n    python: /usr/bin/python3\n"


def _run(tmp_path: Path, text: str | None) -> tuple[int, str, Path]:
    path = tmp_path / "inv.yaml"
    if text is not None:
        path.write_text(text)
    result = Cli(path, tmp_path / "logs")("hosts")
    return result.exit_code, result.stderr.strip(), path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("default: a\nhosts:\n  a:\n" + GOOD_HOST + "    colour: red\n", "hosts.a.colour: unknown key"),
        ("default: a\nhosts:\n  a:\n" + GOOD_HOST + "    gpus: many\n", "hosts.a.gpus:"),
        ("default: a\nhosts:\n  a:\n" + GOOD_HOST + "    port: 70000\n", "hosts.a.port:"),
        ("default: b\nhosts:\n  a:\n" + GOOD_HOST, "default: names no host ('b'"),
        ("default: a\nhosts:\n  a:\n    workdir: wd\n    python: p\n", "hosts.a.address: required"),
        ("default: a\nhosts:\n  a:\n    connection: local\n    python: p\n", "hosts.a.workdir: required key"),
        ("default: a\nhosts:\n  a:\n" + GOOD_HOST + "    connection: telnet\n", "hosts.a.connection:"),
        ("default: a\nhosts:\n  a:\n    address: h\n    workdir: w\n    python: p\n    jump: nowhere\n",
         "hosts.a.jump: names no inventory host"),
        ("default: a\nextra: 1\nhosts:\n  a:\n" + GOOD_HOST, "extra: unknown key"),
        ("default: a\nhosts:\n  a:\n" + GOOD_HOST + "    train_address: gpu1.example\n",
         "hosts.a.train_address: must be an IP address"),
        ("default: a\nhosts:\n  a:\n" + GOOD_HOST + "    train_interface: eth0/1\n",
         "hosts.a.train_interface: must be a network interface name"),
        ("default: a\nhosts: [a, b]\n", "hosts: must be a non-empty mapping"),
        ("default: a\nhosts:\n  a: {workdir: [unclosed\n", "not valid YAML"),
    ],
)
def test_each_malformed_inventory_is_one_line_with_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    code, stderr, path = _run(tmp_path, text)
    assert code == 2
    assert len(stderr.splitlines()) == 1, stderr
    assert str(path) in stderr and expected in stderr


def test_a_missing_inventory_file_is_named(tmp_path: Path) -> None:
    code, stderr, path = _run(tmp_path, None)
    assert code == 2 and str(path) in stderr and "not found" in stderr


def test_an_unknown_host_flag_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("default: a\nhosts:\n  a:\n" + GOOD_HOST)
    result = Cli(path, tmp_path / "logs")("check", "--host", "zz")
    assert result.exit_code == 2
    assert "no host named 'zz'" in result.stderr


def test_local_paths_are_relative_to_the_inventory_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "inv.yaml"
    path.parent.mkdir()
    path.write_text("default: a\nhosts:\n  a:\n" + GOOD_HOST)
    result = Cli(path, tmp_path / "logs")("hosts", "--json")
    assert result.exit_code == 0
    assert result.json()["hosts"][0]["workdir"] == str(tmp_path / "sub" / "wd")


def test_a_runs_dir_that_does_not_exist_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("default: a\nhosts:\n  a:\n" + GOOD_HOST.replace("python: /usr/bin/python3", "python: /bin/true"))
    result = Cli(path, tmp_path / "logs")("check", SPECOPS_RUNS_DIR=str(tmp_path / "nowhere"))
    assert result.exit_code == 2
    assert result.stderr.strip() == f"specops: SPECOPS_RUNS_DIR={tmp_path / 'nowhere'}: not a directory of run configs"


def test_a_gpu_count_that_is_not_a_number_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("default: a\nhosts:\n  a:\n" + GOOD_HOST)
    result = Cli(path, tmp_path / "logs")("train", "--gpus", "many")
    assert result.exit_code == 2 and "--gpus: expected a whole number, got 'many'" in result.stderr
