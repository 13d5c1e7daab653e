"""What fits between runs, and one user of a server at a time (vllm/sharing.py), without a server.

The comparison leaves out only the model's path (masked in an argv too) and the staging folder; any key
vLLM sees makes a misfit. The lease is an flock beside the server's job record: held by another process,
it is in use, a taker waits saying for whom (or gives up after its wait), and a holder killed with -9
leaves it free.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from specops.contract.errors import BadInput
from specops.pipeline.vllm import sharing
from tests.support.agent import REPO, wait_until

WANTED = {"model": "/a/models/tiny", "model_digest": "d1", "tokenizer_digest": "t1", "dtype": "float32",
          "layer_ids": [1, 2, 3, 4], "staging": "/a/runs/tiny/vllm_staging", "port": 8000,
          "argv": ["vllm", "serve", "/a/models/tiny", "--port", "8000"]}


def test_another_path_and_staging_fit_and_what_vllm_sees_does_not() -> None:
    elsewhere = {**WANTED, "model": "/b/models/tiny", "staging": "/b/runs/x/vllm_staging",
                 "argv": ["vllm", "serve", "/b/models/tiny", "--port", "8000"]}
    assert sharing.misfit(elsewhere, WANTED) == []
    assert sharing.fit_view(elsewhere)["argv"] == ["vllm", "serve", "<model>", "--port", "8000"]
    assert sharing.misfit({**elsewhere, "dtype": "bfloat16", "tokenizer_digest": "t2"}, WANTED) == \
        ["dtype", "tokenizer_digest"]
    assert sharing.misfit({**elsewhere, "argv": [*elsewhere["argv"], "--max-model-len", "384"]}, WANTED) == ["argv"]
    assert sharing.misfit(None, WANTED) == ["signature (none recorded)"]
    assert sharing.misfit({**elsewhere, "dtype": "bfloat16"}, WANTED, ("model_digest",)) == []


_HOLD = """
import sys, time
from specops.contract.errors import BadInput
from specops.pipeline.vllm import sharing
sharing.hold(sys.argv[1], "vllm-server-1", "run other (/elsewhere)")
print("held", flush=True)
time.sleep(600)
"""


def test_a_lease_held_elsewhere_is_waited_for_and_freed_by_its_holders_death(tmp_path: Path, capfd) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert sharing.in_use(tmp_path, "vllm-server-1")
        assert sharing.hold(tmp_path, "vllm-server-1", "run mine", wait_s=0.3) is False
        said = capfd.readouterr().err
        assert "waiting for vLLM server job vllm-server-1: in use by run other (/elsewhere) (pid " in said
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    wait_until(lambda: not sharing.in_use(tmp_path, "vllm-server-1"), timeout_s=10, what="the lease to be free")
    assert sharing.hold(tmp_path, "vllm-server-1", "run mine", wait_s=0)
    assert sharing.hold(tmp_path, "vllm-server-1", "run mine", wait_s=0)  # this process holds it already
    assert "run mine" in sharing.user_of(sharing.lease_path(tmp_path, "vllm-server-1"))
    sharing.release_all()


def test_a_job_id_read_from_another_process_never_becomes_a_path(tmp_path: Path) -> None:
    (tmp_path / "state" / "jobs").mkdir(parents=True)
    (tmp_path / "secret.json").write_text('{"meta": {"server": {}}}')
    assert sharing.job_record(tmp_path, "../../secret") == {}  # read as no record: the server is not borrowed
    with pytest.raises(BadInput, match=r"'\.\./vllm-server-1'"):
        sharing.lease_path(tmp_path, "../vllm-server-1")
