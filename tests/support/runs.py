"""testing.runs, under the name the tests have always imported it by (testing/ is shared with bench/)."""

from testing.runs import edit_run, from_source_conversations

__all__ = ["edit_run", "from_source_conversations"]
