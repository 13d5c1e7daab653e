"""testing.repo, under the name the tests have always imported it by (testing/ is shared with bench/)."""

from testing.repo import REPO, SRC

__all__ = ["REPO", "SRC"]
