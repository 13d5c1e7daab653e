"""One line of the doctor's table, and helpers shared by the checks."""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass

RESULTS = ("ok", "warn", "error", "unknown")


@dataclass(frozen=True)
class Item:
    check: str  # "api", "flags", "capability", "model", "resources"
    result: str  # one of RESULTS
    where: str  # file:line, flag, path or package the finding is about
    why: str
    fix: str = ""

    @property
    def id(self) -> str:
        """Stable while the installed files are: `patch new --from-finding ID` names a finding by it."""
        return f"{self.check}-{hashlib.sha1(f'{self.where}|{self.why}'.encode()).hexdigest()[:10]}"

    def to_dict(self) -> dict:
        return {"id": self.id, **asdict(self)}


def version_tuple(version: str | None) -> tuple[int, ...]:
    """(0, 16, 0) for '0.16.0rc1+cu129'; () when unknown. Enough to compare release numbers."""
    if not version:
        return ()
    numbers = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(n) for n in numbers.group(0).split(".")) if numbers else ()


def at_least(version: str | None, minimum: str) -> bool:
    return bool(version_tuple(version)) and version_tuple(version) >= version_tuple(minimum)
