"""The serve env of a host without internet: wheels packed into parts checked by sha256, assembled on the host
once every part has arrived (whatever order, however many transfers), installed into an env made over the host's
python. Real wheels (made here, deterministically), the real agent, a real venv and pip."""

from __future__ import annotations

import base64
import hashlib
import random
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from testing.agent import PYTHON, run_agent


def digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(folder: Path, name: str, version: str, payload_bytes: int, seed: int) -> Path:
    """A pure-Python wheel whose module `NAME_mod` holds VALUE = NAME, with an incompressible blob beside it."""
    blob = random.Random(seed).randbytes(payload_bytes)
    info = f"{name}-{version}.dist-info"
    files = {f"{name}_mod/__init__.py": f"VALUE = {name!r}\n".encode(), f"{name}_mod/blob.bin": blob,
             f"{name}_mod/kernels/other_gpu.so": b"\0" * 4096,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{path},sha256={digest(data)},{len(data)}" for path, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for member, data in files.items():
            wheel.writestr(zipfile.ZipInfo(member, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return path


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("wheelhouse")
    wheels = root / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "alpha", "1.0", 48_000, seed=1)
    make_wheel(wheels, "beta", "2.0", 40_000, seed=2)
    code, document, stderr = run_agent(root, "wheelhouse", "pack", str(wheels), "--out", str(root / "bundle"),
                                       "--name", "serve", "--part-mib", str(20_000 / (1 << 20)), "--fast",
                                       "--drop", "alpha:alpha_mod/kernels/*")
    assert code == 0, (document, stderr)
    return root, document


def test_pack_cuts_the_stream_into_parts_no_larger_than_asked(packed: tuple[Path, dict]) -> None:
    root, document = packed
    parts = sorted((root / "bundle").glob("serve.tar.xz.*"))
    assert len(parts) == len(document["parts"]) >= 4  # ~90 kB of incompressible payload in parts of 20,000 bytes
    assert all(part.stat().st_size <= 20_000 for part in parts)
    assert sum(part.stat().st_size for part in parts) == document["bytes"]
    assert document["dropped"] == {"alpha-1.0-py3-none-any.whl": 1}


def test_assemble_names_what_is_still_to_come_and_unpacks_nothing_until_then(packed: tuple[Path, dict],
                                                                             tmp_path: Path) -> None:
    root, document = packed
    host = tmp_path / "host"
    host.mkdir()
    shutil.copy(root / "bundle" / "manifest.json", host)
    arrived = tmp_path / "transfer"
    arrived.mkdir()
    names = [part["name"] for part in document["parts"]]
    for name in names[::2]:  # every other part came with the first transfer
        shutil.copy(root / "bundle" / name, arrived)
    code, report, _ = run_agent(tmp_path, "wheelhouse", "assemble", str(host), "--from", str(arrived))
    assert code == 1
    assert report["error"].endswith("send again: " + " ".join(names[1::2]))
    assert not (host / "wheels").exists()

    for name in names[1::2]:  # the second transfer brings the rest, one of them damaged on the way
        shutil.copy(root / "bundle" / name, arrived)
    damaged = arrived / names[1]
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"!")
    code, report, _ = run_agent(tmp_path, "wheelhouse", "assemble", str(host), "--from", str(arrived))
    assert code == 1 and report["error"].endswith(f"send again: {names[1]}")

    (host / names[1]).unlink()  # sent again, whole
    shutil.copy(root / "bundle" / names[1], arrived)
    code, report, _ = run_agent(tmp_path, "wheelhouse", "assemble", str(host), "--from", str(arrived))
    assert code == 0, report
    unpacked = sorted(p.name for p in (host / "wheels").iterdir())
    assert unpacked == ["alpha-1.0-py3-none-any.whl", "beta-2.0-py3-none-any.whl"]
    with zipfile.ZipFile(host / "wheels" / "alpha-1.0-py3-none-any.whl") as alpha:
        assert not [n for n in alpha.namelist() if "kernels/" in n]  # dropped, and RECORD no longer lists it
        assert "kernels/" not in alpha.read("alpha-1.0.dist-info/RECORD").decode()


def test_install_makes_an_env_over_the_hosts_python_and_is_idempotent(packed: tuple[Path, dict],
                                                                      tmp_path: Path) -> None:
    root, _ = packed
    host = tmp_path / "bundle"
    shutil.copytree(root / "bundle", host)
    env = tmp_path / "serve-env"
    # the checkout's .venv is itself a venv, as a GPU image's torch env is: its packages must stay visible
    code, report, stderr = run_agent(tmp_path, "wheelhouse", "install", str(host), "--env", str(env),
                                     "--python", PYTHON)
    assert code == 0, (report, stderr)
    assert report["installed"] is True and report["inventory"] == {"envs": {"serve": str(env / "bin" / "python")}}
    seen = subprocess.run([str(env / "bin" / "python"), "-c",
                           "import alpha_mod, beta_mod, yaml; print(alpha_mod.VALUE, beta_mod.VALUE)"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert seen.stdout.split() == ["alpha", "beta"], seen.stderr
    code, again, _ = run_agent(tmp_path, "wheelhouse", "install", str(host), "--env", str(env), "--python", PYTHON)
    assert code == 0 and again["installed"] is False


@pytest.mark.parametrize(("args", "says"), [
    (["--drop", "alpha"], "expected DISTRIBUTION:GLOB"),
    (["--drop", "gamma:x/*"], "--drop names ['gamma']: no such wheel"),
    (["--part-mib", "0"], "--part-mib 0.0: expected"),
])
def test_bad_pack_input_is_one_line_and_exit_2(packed: tuple[Path, dict], tmp_path: Path, args: list[str],
                                               says: str) -> None:
    root, _ = packed
    code, report, _ = run_agent(tmp_path, "wheelhouse", "pack", str(root / "wheels"), "--out", str(tmp_path / "b"),
                                *args)
    assert code == 2 and says in report["error"] and "\n" not in report["error"]
    assert not any((tmp_path / "b").glob("*.tar.xz.*"))


def test_a_folder_without_a_manifest_is_bad_input(tmp_path: Path) -> None:
    code, report, _ = run_agent(tmp_path, "wheelhouse", "assemble", str(tmp_path))
    assert code == 2 and "manifest.json: no manifest" in report["error"]


def test_a_file_that_is_not_a_wheel_stops_the_pack_and_leaves_no_part(packed: tuple[Path, dict],
                                                                      tmp_path: Path) -> None:
    root, _ = packed
    wheels = tmp_path / "wheels"
    shutil.copytree(root / "wheels", wheels)
    (wheels / "zeta-1.0-py3-none-any.whl").write_bytes(b"not a zip")  # sorted last: parts were written before it
    code, report, _ = run_agent(tmp_path, "wheelhouse", "pack", str(wheels), "--out", str(tmp_path / "b"),
                                "--part-mib", str(20_000 / (1 << 20)), "--fast")
    assert code == 2 and report["error"].endswith("zeta-1.0-py3-none-any.whl: not a wheel (not a zip archive)")
    assert list((tmp_path / "b").iterdir()) == []


def test_an_interpreter_that_is_not_there_is_bad_input(packed: tuple[Path, dict], tmp_path: Path) -> None:
    root, _ = packed
    shutil.copytree(root / "bundle", tmp_path / "bundle")
    code, report, _ = run_agent(tmp_path, "wheelhouse", "install", str(tmp_path / "bundle"), "--env",
                                str(tmp_path / "env"), "--python", str(tmp_path / "no-python"))
    assert code == 2 and report["error"] == f"--python {tmp_path / 'no-python'}: no such interpreter"
    assert not (tmp_path / "env").exists()
