"""The doctor's slow parts, cached on the host by what they read (specops.analysis._cache).

The static API check and the model rules are functions of the files they parse; the import probe is a
function of the probed package's files and of what is installed on the search path. Each is stored
with that evidence and reused while the evidence holds. `SPECOPS_ANALYSIS_CACHE` moves the cache;
deleting it is always safe.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from specops.analysis import ModuleIndex, cache, package_files
from specops.doctor import _import_probe as probe
from specops.doctor._report import Item


def enabled() -> bool:
    return os.environ.get("SPECOPS_ANALYSIS_CACHE", "") != "off"


def cached_items(name: str, parts: list, index: ModuleIndex, produce: Callable[[], list[Item]],
                 hits: dict[str, bool]) -> list[Item]:
    """`produce()`'s items, or the stored ones while every file and folder they came from is unchanged."""
    if not enabled():
        return produce()
    # files read through an overlay (fitting patch sets not applied yet) are part of what was judged
    overlaid = sorted((str(path), cache.key_of(text)) for path, text in index.overlays.items())
    key = cache.key_of(name, index.search_path, overlaid, *parts)
    stored = cache.load(key)
    if isinstance(stored, list):
        hits[name] = True  # the agent's own files (the pipeline's calls) named where this copy of them lives
        return [Item(**{k: v for k, v in item.items() if k != "id"}) for item in cache.located(stored)]
    found = produce()
    hits[name] = False
    cache.store(key, cache.relocatable([item.to_dict() for item in found]), cache.index_evidence(index))
    return found


def start_probe(index: ModuleIndex, search_path: list[str], hits: dict[str, bool]) -> tuple[probe.Probe, Callable]:
    """A running (or remembered) import probe, and how to remember its answer once read."""
    modules = [m for m in probe.PACKAGES if index.module_file(m) is not None]
    key = cache.key_of("import", sys.executable, search_path, modules)
    if enabled():
        stored = cache.load(key)
        if isinstance(stored, list):
            hits["import"] = True
            return probe.cached_probe(modules, stored), lambda _results: None
    hits["import"] = False
    running = probe.start(index, search_path)

    def remember(results: list[dict]) -> None:
        if not enabled() or not results:
            return
        files = [f for m in modules for f in package_files(m, index)]
        # the search path's folders (what is installed) and the package's own (a module that appears)
        places = [Path(entry) for entry in search_path] + sorted({f.parent for f in files})
        folders = {place: _names(place) for place in places if place.is_dir()}
        cache.store(key, results, cache.evidence(files, folders))

    return running, remember


def _names(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []
