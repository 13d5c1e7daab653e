"""A local journal of operations that matter (accepted host keys, patches applied, launches)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from remote.inventory import REPO_ROOT


def journal_path() -> Path:
    return Path(os.environ.get("SPECOPS_LOGS") or REPO_ROOT / "logs") / "journal.jsonl"


def record(event: str, **fields: object) -> None:
    path = journal_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "event": event, **fields}
    with path.open("a") as handle:
        handle.write(json.dumps(entry, default=str) + "\n")
