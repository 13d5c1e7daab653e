"""Which host ended a training group: the report names the cause, not the peers that failed after it."""

from __future__ import annotations

from remote.errors import AgentError
from remote.training_nodes import first_to_fail


def job(state: str, ended: str | None = None) -> dict:
    return {"state": state, "ended": ended}


def test_while_every_job_runs_or_succeeded_nothing_failed() -> None:
    assert first_to_fail({"gpu1": job("running"), "gpu2": job("succeeded", "2026-12-04T10:00:00.000+00:00")}) is None


def test_a_killed_node_is_named_though_its_peer_failed_too_and_comes_first_in_the_inventory() -> None:
    records = {"gpu1": job("failed", "2026-12-04T10:00:03.412+00:00"),   # its collectives broke after
               "gpu2": job("failed", "2026-12-04T10:00:00.120+00:00")}   # killed first
    assert first_to_fail(records) == "gpu2"


def test_a_host_gone_silent_is_the_cause_of_its_peers_failure() -> None:
    records = {"gpu1": job("failed", "2026-12-04T10:00:00.100+00:00"),
               "gpu2": AgentError("gpu2: no answer within 5 s")}
    assert first_to_fail(records) == "gpu2"


def test_one_failed_job_among_running_ones_is_the_cause() -> None:
    assert first_to_fail({"gpu1": job("running"), "gpu2": job("stopped", "2026-12-04T10:00:00.100+00:00"),
                          "gpu3": job("running")}) == "gpu2"
