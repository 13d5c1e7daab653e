"""A kept server's stated lifetime: `vllm.keep_server` is false, true (until stopped by hand) or an idle
timeout (`30m`, `2h`, `90s`, seconds); a bad value is one line naming the file and key (exit 2); what
`invoke status` says of a kept server. The watch on a real server: test_reuse.py (its last test).
"""

from __future__ import annotations

import pytest

from tests.support.agent import run_agent
from tests.support.runs import edit_run
from tests.support.vllm import tiny_workdir
from tests.vllm.conftest import free_port


@pytest.mark.parametrize(("value", "seconds"), [(True, True), (False, False), ("30m", 1800), (90, 90), ("2h", 7200),
                                                ("45s", 45)])
def test_keep_server_values(tmp_path, value, seconds) -> None:
    import os

    workdir = tiny_workdir(tmp_path / "w", free_port())
    edit_run(workdir / "runs" / "tiny.yaml", vllm={"keep_server": value})
    os.environ["SPECOPS_WORKDIR"] = str(workdir)
    from specops.pipeline.run.config import load_run_config

    assert load_run_config(workdir / "runs" / "tiny.yaml").vllm.keep_server == seconds


@pytest.mark.parametrize(("value", "says"), [("soon", "'soon' is not true, false or an idle timeout"),
                                             (0, "an idle timeout of 0 is under a second"),
                                             ([30], "[30] is not true, false or an idle timeout")])
def test_a_bad_keep_server_is_one_line_exit_2(tmp_path, value, says) -> None:
    workdir = tiny_workdir(tmp_path / "w", free_port())
    edit_run(workdir / "runs" / "tiny.yaml", vllm={"keep_server": value})
    code, document, _ = run_agent(workdir, "run", "check", "--run", "tiny")
    assert code == 2, document
    assert "\n" not in document["error"]
    assert document["error"].startswith(f"runs/tiny.yaml: vllm.keep_server: {says}"), document["error"]


def test_status_says_who_kept_the_server_and_the_idle_time_left() -> None:
    from remote.tasks.jobs import kept_line

    assert kept_line({"kept": {"owner_run": "a", "idle_s": None, "idle_left_s": None}}) == \
        "kept by run a, until stopped (vllm.keep_server: true)"
    assert kept_line({"kept": {"owner_run": "a", "idle_s": 1800, "idle_left_s": 754.2}}) == \
        "kept by run a, stops after 30m00s unused: 12m34s left"
    assert kept_line({"kept": {"owner_run": "a", "idle_s": 7200, "idle_left_s": 7200}}) == \
        "kept by run a, stops after 2h00m unused: 2h00m left"
    assert kept_line({"kept": {"owner_run": "a", "idle_s": 1800, "in_use": True, "idle_left_s": 1800}}) == \
        "kept by run a, in use (stops after 30m00s unused)"


def test_the_time_left_counts_from_the_last_use_and_stands_still_while_in_use() -> None:
    import time

    from specops.jobs.liveness import kept_server

    idle = kept_server({"owner_run": "a", "idle_s": 1800, "last_used": time.time() - 600, "in_use": False})["kept"]
    assert 1195 <= idle["idle_left_s"] <= 1200 and idle["in_use"] is False
    used = kept_server({"owner_run": "a", "idle_s": 1800, "last_used": time.time() - 600, "in_use": True})["kept"]
    assert used["idle_left_s"] == 1800 and used["in_use"] is True
    assert kept_server({"owner_run": "a", "idle_s": None})["kept"]["idle_left_s"] is None


def test_a_kept_server_is_named_with_how_long_it_stays_and_how_to_stop_it(tmp_path) -> None:
    import os

    workdir = tiny_workdir(tmp_path / "w", free_port())
    os.environ["SPECOPS_WORKDIR"] = str(workdir)
    from specops.pipeline.run import Run
    from specops.pipeline.vllm.lifetime import stays_line

    run = Run("tiny", workdir)
    assert stays_line(run, {"server": "vllm-server-1", "idle_s": 1800, "job": "vllm-keeper-1"}) == (
        "vLLM server job vllm-server-1 of run tiny stays up until unused for 30m00s (vllm.keep_server; watched by "
        "job vllm-keeper-1); stop it now with `invoke stop --run tiny --job vllm-server-1`")
    assert stays_line(run, {"server": "vllm-server-1", "idle_s": None, "job": None}) == (
        "vLLM server job vllm-server-1 of run tiny stays up until stopped by hand (vllm.keep_server: true); "
        "stop it now with `invoke stop --run tiny --job vllm-server-1`")
