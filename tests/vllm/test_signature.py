"""A running server is reused unless vLLM would serve differently: the draft's bytes decide, not its folder.

generation_signature is what a running generating server's recorded signature is compared with
(CONTRIBUTING: which server-config keys matter). No server here: the signature of two argv lists.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from specops.pipeline.vllm.generation import eagle3_config, generation_signature
from tests.support.runs import edit_run
from tests.support.vllm import free_port, tiny_workdir


def _signature(run, draft: Path, tokens: int = 3) -> dict:
    speculative = eagle3_config(draft, tokens)
    argv = ["/env/bin/vllm", "serve", str(run.model_path), "--speculative-config",
            json.dumps(speculative, separators=(",", ":"))]
    return generation_signature(run, argv, speculative, "0.32.0", 8000, 0)


def _draft(folder: Path, weights: bytes, config: str = '{"aux": [1, 2, 3]}') -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "config.json").write_text(config)
    return folder


def _run(tmp_path: Path, monkeypatch):
    from specops.pipeline.run import Run

    root = tiny_workdir(tmp_path / "w", free_port())
    monkeypatch.setenv("SPECOPS_WORKDIR", str(root))
    return root, Run("tiny", root)


def test_the_same_draft_copied_elsewhere_keeps_the_server(tmp_path, monkeypatch) -> None:
    _, run = _run(tmp_path, monkeypatch)
    first = _draft(tmp_path / "parity" / "untrained", b"weights")
    copy = tmp_path / "evaluation" / "untrained"
    shutil.copytree(first, copy)
    assert _signature(run, first) == _signature(run, copy)


def test_other_weights_another_config_or_another_k_replace_it(tmp_path, monkeypatch) -> None:
    _, run = _run(tmp_path, monkeypatch)
    base = _signature(run, _draft(tmp_path / "a", b"weights"))
    assert _signature(run, _draft(tmp_path / "b", b"other weights")) != base
    assert _signature(run, _draft(tmp_path / "c", b"weights", '{"aux": [0, 2, 3]}')) != base
    assert _signature(run, _draft(tmp_path / "d", b"weights"), tokens=4) != base


def test_the_runs_serve_args_replace_it(tmp_path, monkeypatch) -> None:
    root, run = _run(tmp_path, monkeypatch)
    draft = _draft(tmp_path / "a", b"weights")
    before = _signature(run, draft)
    edit_run(root / "runs" / "tiny.yaml", vllm={"serve_args": ["--max-model-len", "1024"]})
    from specops.pipeline.run import Run

    assert _signature(Run("tiny", root), draft) != before
