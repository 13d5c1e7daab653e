"""The doctor: what a model load would find, found from the installed sources in seconds.

A leaf: it reads installed packages (standard library only) and a `RunSettings` value; it never
imports the pipeline. Without a run it judges the installed stack (API contracts, capabilities);
with one it adds the run's checks (flags, model config, resources).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from specops.doctor._contract import PIPELINE
from specops.doctor.checks import CHECKS, run_doctor
from specops.doctor.settings import RunSettings, parse_run_json
from specops.errors import BadInput

RUN_CHECKS = ("flags", "model", "resources")  # about a run's settings: meaningless without one
STACK_CHECKS = tuple(name for name in CHECKS if name not in RUN_CHECKS)

__all__ = ["CHECKS", "PIPELINE", "RUN_CHECKS", "STACK_CHECKS", "RunSettings", "diagnose", "parse_run_json", "site_path"]


def diagnose(search_path: list[str] | None = None, run: RunSettings | None = None,
             checks: Iterable[str] | None = None) -> dict:
    """The doctor's document: {"ok", "scope", "findings", "versions", "timing_s"}; ok is False when any
    finding is an error.

    search_path  where the installed packages are looked up (default: this interpreter's sys.path)
    run          the run to judge; None judges the installed stack alone (scope "stack")
    checks       a subset of CHECKS (default: every check that applies to the scope)
    """
    wanted = tuple(checks) if checks is not None else (CHECKS if run is not None else STACK_CHECKS)
    for name in wanted:
        if name not in CHECKS:
            raise BadInput(f"--checks: unknown check {name!r}; choose from {', '.join(CHECKS)}")
        if run is None and name in RUN_CHECKS:
            raise BadInput(f"--checks: {name} checks a run's settings; give --run NAME or --run-json")
    document = run_doctor(run or RunSettings(backend=None), search_path, wanted)
    return {"ok": document["ok"], "scope": "run" if run is not None else "stack",
            **{key: value for key, value in document.items() if key != "ok"}}


def site_path(sites: list[str] | None) -> list[str]:
    """--site folders first, then this interpreter's path: what the run's Python would see."""
    return [str(Path(site).resolve()) for site in sites or []] + sys.path
