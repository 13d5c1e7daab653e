"""The analysis cache: a result comes back while every file it read and folder it listed is as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specops.analysis import ModuleIndex
from specops.analysis import _cache as cache


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECOPS_ANALYSIS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def indexed(site: Path) -> ModuleIndex:
    index = ModuleIndex([str(site)])
    index.tree(index.module_file("pkg.mod"))  # type: ignore[arg-type]
    return index


def test_a_touched_but_identical_file_still_hits_and_an_edited_one_misses(tmp_path: Path, cache_dir: Path) -> None:
    module = tmp_path / "site" / "pkg" / "mod.py"
    module.parent.mkdir(parents=True)
    (module.parent / "__init__.py").write_text("")
    module.write_text("X = 1\n")
    key = cache.key_of("test", "pkg")
    cache.store(key, {"answer": 42}, cache.index_evidence(indexed(tmp_path / "site")))

    assert cache.load(key) == {"answer": 42}
    stat = module.stat()
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # same bytes, new mtime
    assert cache.load(key) == {"answer": 42}
    module.write_text("X = 2\n")
    assert cache.load(key) is None


def test_a_module_that_appears_beside_the_ones_read_misses(tmp_path: Path, cache_dir: Path) -> None:
    package = tmp_path / "site" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text("X = 1\n")
    key = cache.key_of("test", "pkg")
    cache.store(key, [1], cache.index_evidence(indexed(tmp_path / "site")))

    (package / "new.py").write_text("")
    assert cache.load(key) is None


def test_the_cache_is_safe_to_delete_and_a_corrupt_entry_is_a_miss(tmp_path: Path, cache_dir: Path) -> None:
    key = cache.key_of("test", "nothing")
    cache.store(key, [1], cache.evidence([], {}))
    assert cache.load(key) == [1]
    (cache_dir / f"{key}.json").write_text("{not json")
    assert cache.load(key) is None
    for entry in cache_dir.iterdir():
        entry.unlink()
    cache_dir.rmdir()
    assert cache.load(key) is None
    cache.store(key, [2], cache.evidence([], {}))
    assert cache.load(key) == [2]
