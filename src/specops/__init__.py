"""specops host agent: runs inside the host's ML env, prints one JSON document per command."""

__version__ = "0.1.0"
