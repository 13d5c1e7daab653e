"""Invoke tasks, one module per task group; each renders its own output. tasks.py registers them."""
