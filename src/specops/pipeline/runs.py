"""Opening a run for a step, and the numeric flag types the pipeline's commands share."""

from __future__ import annotations

from typing import Any

from specops.errors import BadInput


def open_run(name: str) -> Any:
    """The named run, with the embedded tiny target generated first when the run uses it (a second
    or so, deterministic, and exactly what the run's first step would make)."""
    from specops.paths import workdir
    from specops.pipeline.config import Run
    from specops.pipeline.tiny import generate

    run = Run(name)
    if run.config.embedded == "tiny":
        generate(workdir())
    return run


def visible_gpus() -> int:
    """NVIDIA GPUs this host shows, from its device nodes: asking torch or nvidia-smi costs
    seconds or a subprocess, and every step that picks a backend or a launcher asks."""
    from pathlib import Path

    return sum(1 for node in Path("/dev").glob("nvidia[0-9]*") if node.name[6:].isdigit())


def positive_int(value: str) -> int:
    """argparse type: a whole number > 0; anything else is bad input."""
    try:
        number = int(value)
    except ValueError:
        raise BadInput(f"expected a whole number, got {value!r}") from None
    if number <= 0:
        raise BadInput(f"expected a number > 0, got {number}")
    return number
