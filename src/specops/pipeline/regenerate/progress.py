"""What a user waits on while the target answers, shown: conversations done of those asked, answers written,
answers a second and an ETA, as extraction shows its samples.

One line on stderr (the job's log, which `invoke` follows) at most every `every_s` seconds, and the same
figures in <run>/regenerated/progress.json for `invoke status`. The hf backend counts each finished batch and,
inside a long one, the generation steps (a batch of 32 long answers is minutes on a real model); the vllm
backend counts what speculators' client appends to its outfile while it runs (`OutfileWatcher`): the client
writes a conversation's rows when the conversation is done, its failures to the errors file.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROGRESS_FILE = "progress.json"
EVERY_S = 10.0  # a line every 10 s: minutes of answers read as a few dozen lines, not thousands
PACE_ENV = "SPECOPS_PROGRESS_S"  # another pace (a test's tiny model answers a batch in a second)
WATCH_S = 1.0  # how often the outfile is looked at (a stat, and the new bytes when it grew)


@dataclass
class Answering:
    """The counts of one answering pass and their line."""

    path: Path  # progress.json
    total: int  # conversations this pass asks
    every_s: float = field(default_factory=lambda: pace())
    done: int = 0  # conversations finished: answered or failed
    answers: int = 0  # rows written (one per answered turn)
    failed: int = 0
    tokens: int = 0  # answer tokens written
    detail: str = ""  # where a long batch is (hf)
    _started: float = 0.0
    _last: float = field(default=0.0, repr=False)
    _said: tuple[Any, ...] = field(default=(), repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(self) -> None:
        """After the model load (hf) or once the client runs (vllm): rates and ETA are of the answering."""
        self._started = self._last = time.monotonic()
        self.report(force=True)

    def add(self, conversations: int, answers: int, failed: int = 0, tokens: int = 0, force: bool = False) -> None:
        """`force`: a line now (the hf backend's batches: each is long, its end is news)."""
        with self._lock:
            self.done += conversations
            self.answers += answers
            self.failed += failed
            self.tokens += tokens
            self.detail = ""
        self.report(force=force)

    def within(self, detail: str) -> None:
        """Where a long piece of work is (a batch's generation step): shown on the next line, which comes at
        the usual pace."""
        self.detail = detail
        self.report()

    def document(self, state: str) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        rate = self.done / elapsed
        return {"step": "regenerate", "state": state, "done": self.done, "total": self.total,
                "answers": self.answers, "failed": self.failed,
                "answers_per_s": round(self.answers / elapsed, 3), "tokens_per_s": round(self.tokens / elapsed, 1),
                "eta_s": round((self.total - self.done) / rate, 1) if rate > 0 else None,
                "elapsed_s": round(elapsed, 2), "updated_at": time.time()}

    def line(self, document: dict[str, Any]) -> str:
        eta = "?" if document["eta_s"] is None else f"{document['eta_s']:.0f}s"
        failed = f", {self.failed} failed" if self.failed else ""
        where = f" ({self.detail})" if self.detail else ""
        return (f"regenerate: {self.done}/{self.total} conversations, {self.answers} answers{failed}, "
                f"{document['answers_per_s']} answers/s, ETA {eta}{where}")

    def report(self, force: bool = False, state: str = "running") -> None:
        with self._lock:
            now = time.monotonic()
            if not force and now - self._last < self.every_s:
                return
            self._last = now
            document = self.document(state)
        _swap_in(self.path, document)
        said = (self.done, self.answers, self.failed, self.detail)
        if state == "running" or said != self._said:  # the last count again is no news
            print(self.line(document), file=sys.stderr, flush=True)
        self._said = said

    def finish(self) -> None:
        self.report(force=True, state="done")


def pace() -> float:
    """Seconds between two lines: EVERY_S, or SPECOPS_PROGRESS_S."""
    try:
        return float(os.environ.get(PACE_ENV) or EVERY_S)
    except ValueError:
        return EVERY_S


class OutfileWatcher:
    """While speculators' client runs: the rows it appends to responses.jsonl and the failures it appends to
    responses.errors.jsonl since the watch began, counted into `progress` (a thread; a context manager)."""

    def __init__(self, progress: Answering, responses: Path, errors: Path, every_s: float = WATCH_S) -> None:
        self.progress, self.every_s = progress, every_s
        # what is there already was written before this pass (the client resumes after it)
        self.files = {path: _size(path) for path in (responses, errors)}
        self.responses = responses
        self.pending = {path: b"" for path in self.files}
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="regenerate-progress", daemon=True)

    def __enter__(self) -> OutfileWatcher:
        self.progress.start()
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()  # what the client wrote last

    def _watch(self) -> None:
        while not self._stop.wait(self.every_s):
            self.poll()
            self.progress.report()  # the rates fall while nothing comes: say so at the usual pace

    def poll(self) -> None:
        conversations = answers = failed = tokens = 0
        for path, offset in self.files.items():
            size = _size(path)
            if size <= offset:
                continue
            with path.open("rb") as handle:
                handle.seek(offset)
                data = self.pending[path] + handle.read(size - offset)
            self.files[path] = size
            *lines, self.pending[path] = data.split(b"\n")  # a line still being written waits for its end
            for raw in lines:
                try:
                    row = json.loads(raw)
                except ValueError:
                    continue
                key = str(row.get("primary_id") or row.get("id"))
                new = key not in self.seen
                self.seen.add(key)
                if path == self.responses:
                    answers += 1
                    tokens += ((row.get("metadata") or {}).get("usage") or {}).get("completion_tokens") or 0
                    conversations += new
                else:
                    failed += 1
                    conversations += new
        if conversations or answers or failed:
            self.progress.add(conversations, answers, failed, tokens)


def _swap_in(path: Path, document: dict[str, Any]) -> None:
    """Written beside and renamed in, so a reader never sees half of it; not fsynced (atomic.write_json does,
    twice): a progress file lost in a crash is rewritten by the next line, and lines may come many a second."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(document))
    os.replace(temporary, path)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def answered_before(responses: Path) -> set[str]:
    """The conversations responses.jsonl already holds (speculators' --resume skips them)."""
    found: set[str] = set()
    try:
        with responses.open(encoding="utf-8") as handle:
            for line in handle:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                found.add(str(row.get("primary_id") or row.get("id")))
    except OSError:
        pass
    return found
