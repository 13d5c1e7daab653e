"""Where this checkout is: the one definition every test helper uses."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
