"""The control side: runs on the workstation, drives hosts over SSH. Never imports torch, vllm or speculators.

The contract both sides share, `specops.contract.protocol` (stdlib only), lives in this checkout's src/;
it is put on the path here so every entry point (invoke, bench, tests) imports the same file.
"""

import sys
from pathlib import Path

_SRC = str(Path(__file__).resolve().parent.parent / "src")
if _SRC not in sys.path:
    sys.path.append(_SRC)
