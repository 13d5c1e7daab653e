"""Step `evaluate`: the draft's acceptance when it speculates for the target, on held-out prompts."""
