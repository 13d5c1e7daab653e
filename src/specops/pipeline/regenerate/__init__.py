"""Step `regenerate`: the target answers the source conversations' prompts itself (before prepare)."""
