"""Check 1, the engine loop: speculators code that drives vLLM's scheduler and executor by hand makes
every step the installed engine's own loop makes (read from vLLM's EngineCore.step)."""

from __future__ import annotations

from specops.analysis import ModuleIndex, check_engine_loop, package_files
from specops.doctor._report import Item

CALLER = "speculators"
DRIVER_HINTS = ("schedule(", "execute_model(")  # text test before parsing: the file drives both


def check_engine_loops(index: ModuleIndex, versions: dict[str, str | None]) -> list[Item]:
    if index.module_file(CALLER) is None or index.module_file("vllm") is None:
        return []
    items = []
    for file in package_files(CALLER, index):
        text = index.text(file) or ""
        if not all(hint in text for hint in DRIVER_HINTS):
            continue
        for skipped in check_engine_loop(file, index):
            fix = (f"patch speculators {versions.get(CALLER)} to call {skipped.step.method} as vLLM "
                   f"{versions.get('vllm')}'s engine does") if skipped.status == "error" else ""
            items.append(Item("api", skipped.status, f"{skipped.file}:{skipped.line}", skipped.detail, fix))
    return items
