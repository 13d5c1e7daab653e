"""The nodes of a run across hosts meet at a rendezvous on the first host (pipeline.hosts): two nodes on
loopback, each in its own thread, as two hosts' engines would be in their own processes.

They wait for each other, share JSON, copy each other's files whole (larger than one store value,
nested, written beside and renamed in), and a node that fails stops the other at its next wait with
one line naming the failing host; one that stops beating is named by the other's trainer watch.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from specops.contract.errors import CheckFailed
from specops.pipeline import hosts as rendezvous
from specops.pipeline.shares import shares_fit
from tests.support.sshd import free_port

NAMES = ["gpu1", "gpu2"]


def both(work: Any) -> list[Any]:
    """work(node) on node 0 and node 1 at once; their values (or the exception each raised)."""
    port, group = free_port(), f"test-{free_port()}"

    def one(rank: int) -> Any:
        node = rendezvous.Rendezvous(NAMES, rank, "127.0.0.1", port, group)
        try:
            return work(node)
        except Exception as exc:  # the test looks at it
            node.fail(str(exc))  # as the engine does
            return exc
        finally:
            node.close()

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, [0, 1]))


def test_the_nodes_share_values_by_rank_and_each_others_files_whole(tmp_path: Path) -> None:
    big = bytes(range(256)) * (rendezvous.CHUNK // 256 * 2 + 3)  # three store values

    def work(node: rendezvous.Rendezvous) -> Any:
        folder = tmp_path / NAMES[node.rank]
        mine = [f"hs_{node.rank}.safetensors", f"{node.rank}/nested/state.pt"]
        for name in mine:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(big + name.encode())
        node.barrier("written")
        values = node.all_gather("plan", {"rank": node.rank, "host": NAMES[node.rank]})
        return values, node.exchange("files", folder, mine, lacking=True)

    (values0, copied0), (values1, copied1) = both(work)
    assert values0 == values1 == [{"rank": 0, "host": "gpu1"}, {"rank": 1, "host": "gpu2"}]
    for name in ("hs_0.safetensors", "0/nested/state.pt", "hs_1.safetensors", "1/nested/state.pt"):
        assert (tmp_path / "gpu1" / name).read_bytes() == (tmp_path / "gpu2" / name).read_bytes() == big + name.encode()
    assert copied0["copies"] == copied1["copies"] == [{"from": "gpu1", "to": ["gpu2"], "files": 2},
                                                      {"from": "gpu2", "to": ["gpu1"], "files": 2}]
    assert not list(tmp_path.rglob("*.tmp*"))  # nothing half-written left beside the files


def test_a_node_that_fails_stops_the_other_at_its_next_wait_naming_it() -> None:
    def work(node: rendezvous.Rendezvous) -> Any:
        if node.rank == 1:
            node.fail("extract: hs_3.safetensors: the header promises 120 tokens")
            raise CheckFailed("failed here")
        node.barrier("extract")
        return "passed the barrier"

    first, second = both(work)
    assert isinstance(first, CheckFailed) and isinstance(second, CheckFailed)
    assert str(first) == "gpu2: extract: hs_3.safetensors: the header promises 120 tokens"


def test_a_file_name_leaving_the_folder_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    def work(node: rendezvous.Rendezvous) -> Any:
        mine = ["../escape"] if node.rank == 0 else []
        return node.exchange("files", tmp_path, mine, lacking=True)

    first, second = both(work)
    assert isinstance(first, CheckFailed) and "would leave the folder" in str(first)
    assert isinstance(second, CheckFailed) and str(second).startswith("gpu1: ")


def test_one_host_is_the_same_engine_with_nothing_to_meet() -> None:
    from specops.pipeline.run.context import OneHost

    one = OneHost()
    one.barrier("extract")
    assert one.all_gather("plan", {"rows": 3}) == [{"rows": 3}]
    assert one.exchange("extract", Path("/nowhere"), ["hs_0.safetensors"], True) == {"copies": [], "bytes": 0}


def test_hosts_that_planned_different_work_are_refused_naming_each_hosts_plan() -> None:
    # what each node's share of an extraction reports through all_gather: its inputs hash and N
    plans = [{"inputs_hash": "a" * 64, "samples": 200, "rows": 100},
             {"inputs_hash": "b" * 64, "samples": 200, "rows": 100}]
    try:
        shares_fit("extract", plans, NAMES, "samples", "target, data, dtype or device")
    except CheckFailed as failure:
        message = str(failure)
    else:
        raise AssertionError("different inputs were let through")
    assert message == ("extract across hosts: the hosts planned different work (gpu1: aaaaaaaaaaaa of 200 samples, "
                       "gpu2: bbbbbbbbbbbb of 200 samples); their target, data, dtype or device differ, so their "
                       "shares would not fit together")


def test_hosts_that_planned_the_same_work_pass_whatever_their_own_share() -> None:
    plans = [{"inputs_hash": "a" * 64, "conversations": 180, "rows": 90},
             {"inputs_hash": "a" * 64, "conversations": 180, "rows": 89}]
    shares_fit("regenerate", plans, NAMES, "conversations", "target, data or sampling settings")
    plans[1]["conversations"] = 181  # the same inputs, another count: the shares would overlap or leave a gap
    try:
        shares_fit("regenerate", plans, NAMES, "conversations", "target, data or sampling settings")
    except CheckFailed as failure:
        assert "gpu2: aaaaaaaaaaaa of 181 conversations" in str(failure)
    else:
        raise AssertionError("different counts were let through")


def test_a_node_that_stops_beating_is_named_by_its_peers_watch_and_one_that_failed_by_its_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What stops a trainer across hosts (training.peers): the watch asks the rendezvous each beat; a node
    silent for SILENT_S (here SPECOPS_SILENT_S, shortened) is named, as is the reason a failed node gave; the
    cause of a trainer's own failure is the host that went, not the trainer that followed it."""
    import threading

    from specops.pipeline.training.peers import PeerWatch

    monkeypatch.setenv("SPECOPS_SILENT_S", "4")

    def work(node: rendezvous.Rendezvous) -> Any:
        node.barrier("both-up")
        if node.rank == 1:
            node._stopped.set()  # its beat ends, as when its engine is killed -9 or its host is cut off
            return None
        assert node.gone() is None  # every node heard
        stopped = threading.Event()
        watch = PeerWatch(node.gone, period_s=0.2)
        watch.start(stopped.set)
        try:
            assert stopped.wait(120), "the watch never stopped the trainer"
        finally:
            watch.stop()
        return watch.reason, watch.cause(within_s=1.0)

    first, second = both(work)
    assert second is None
    reason, cause = first
    assert reason.startswith("gpu2: its engine has not been heard for ") and reason.endswith(
        " s (killed, its host down or cut off)"), reason
    assert cause.startswith("gpu2: ")

    watching = threading.Event()  # node 0 is past the barrier: a failure now reaches its watch, not its wait

    def failing(node: rendezvous.Rendezvous) -> Any:
        node.barrier("both-up")
        if node.rank == 1:
            assert watching.wait(120), "node 0 never got past the barrier"
            node.fail("train: the trainer (speculators train) exited with status 1")
            return None
        watching.set()
        watch = PeerWatch(node.gone, period_s=0.2)
        return watch.cause(within_s=30.0)

    first, _second = both(failing)
    assert first == "gpu2: train: the trainer (speculators train) exited with status 1"


def test_a_bad_silence_setting_is_one_line_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from specops.contract.errors import BadInput

    monkeypatch.setenv("SPECOPS_SILENT_S", "soon")
    with pytest.raises(BadInput, match=r"^SPECOPS_SILENT_S: expected a positive number of seconds, got 'soon'$"):
        rendezvous.silent_s()
