"""The hidden-state writer: every thread takes any row of a batch (so the last batch is written by all
of them at once), at most `depth` batches wait, a batch's buffer is given back after its last row,
and the first error of any job reaches the producer."""

from __future__ import annotations

import threading
import time

import pytest

from specops.pipeline.extraction import BackgroundWriter


def test_the_rows_of_one_batch_are_written_by_several_threads_at_once() -> None:
    writer = BackgroundWriter(threads=2, depth=2)
    both_inside = threading.Barrier(2, timeout=30)  # breaks unless two rows are being written together
    names: set[str] = set()

    def row() -> None:
        names.add(threading.current_thread().name)
        both_inside.wait()

    writer.submit_batch([row, row])
    writer.close()
    assert len(names) == 2


def test_a_batch_is_done_after_its_last_row_and_only_then() -> None:
    writer = BackgroundWriter(threads=2, depth=2)
    written: list[int] = []
    done_saw: list[list[int]] = []
    writer.submit_batch([lambda n=n: (time.sleep(0.01 * n), written.append(n)) for n in range(5)],
                        on_done=lambda: done_saw.append(sorted(written)))
    writer.close()
    assert done_saw == [[0, 1, 2, 3, 4]]


def test_the_producer_waits_while_depth_batches_are_pending() -> None:
    writer = BackgroundWriter(threads=1, depth=2)
    gate = threading.Event()
    writer.submit_batch([gate.wait])
    writer.submit_batch([lambda: None])
    third = threading.Thread(target=writer.submit_batch, args=([lambda: None],), daemon=True)
    third.start()
    third.join(timeout=0.5)
    assert third.is_alive()  # blocked: two batches are pending
    gate.set()
    third.join(timeout=30)
    assert not third.is_alive()
    writer.close()


def test_the_first_error_reaches_the_producer_and_buffers_still_come_back() -> None:
    writer = BackgroundWriter(threads=2, depth=2)
    released: list[str] = []

    def broken() -> None:
        raise OSError("disk full")

    writer.submit_batch([broken, lambda: None], on_done=lambda: released.append("first"))
    with pytest.raises(OSError, match="disk full"):
        for _ in range(50):  # a later submit, or close, raises it
            writer.submit_batch([lambda: None], on_done=lambda: released.append("later"))
            time.sleep(0.01)
        writer.close()
    assert released[0] == "first"


def test_an_empty_batch_is_done_at_once() -> None:
    writer = BackgroundWriter(threads=1, depth=1)
    done: list[bool] = []
    for _ in range(3):  # each frees its slot, or the second would block forever
        writer.submit_batch([], on_done=lambda: done.append(True))
    writer.close()
    assert done == [True, True, True]
