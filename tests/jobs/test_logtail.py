"""Pure functions behind `job tail`: whole-line chunks and the start of the last N lines."""

from __future__ import annotations

from pathlib import Path

from specops.jobs import logtail, records


def test_a_chunk_stops_at_the_last_line_end_unless_the_log_is_complete(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes("één\ntwee\rdrie".encode())
    data, offset = logtail.read_chunk(log, 0, complete=False)
    assert data == "één\ntwee\r".encode() and offset == len(data)
    assert logtail.read_chunk(log, offset, complete=False) == (b"", offset)
    assert logtail.read_chunk(log, offset, complete=True) == (b"drie", len(log.read_bytes()))


def test_a_line_longer_than_a_chunk_is_sent_in_pieces(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(b"x" * (logtail.MAX_CHUNK + 10))
    data, offset = logtail.read_chunk(log, 0, complete=False)
    assert len(data) == offset == logtail.MAX_CHUNK


def test_the_last_lines_start_after_the_newline_before_them(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(b"a\nb\nc\npartial")
    assert logtail.offset_of_last_lines(log, 2) == 2
    assert logtail.offset_of_last_lines(log, 0) == len(b"a\nb\nc\n")
    assert logtail.offset_of_last_lines(log, 10) == 0
    assert logtail.offset_of_last_lines(tmp_path / "missing.log", 5) == 0


def test_the_last_lines_of_a_log_longer_than_one_backward_read(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    lines = [f"line {number:06d}\n".encode() for number in range(20000)]
    log.write_bytes(b"".join(lines))
    start = logtail.offset_of_last_lines(log, 12000)
    assert log.read_bytes()[start:] == b"".join(lines[-12000:])


def test_job_ids_are_safe_as_file_and_tmux_session_names() -> None:
    job_id = records.new_job_id("vllm server: a.b/c")
    assert records.is_job_id(job_id) and job_id.startswith("vllm_server_a_b_c-")
    assert records.slug("$$$") == "job"
    assert not records.is_job_id("../x") and not records.is_job_id("a.b")
