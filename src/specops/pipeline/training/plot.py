"""A PNG of training loss per step, written next to the checkpoints (fetched home with them)."""

from __future__ import annotations

import io
from pathlib import Path

from specops.atomic import write_bytes

PLOT_FILE = "loss.png"


def plot_loss(points: list[tuple[int, float]], path: Path, title: str = "") -> Path | None:
    """Write the loss curve to `path` atomically; None (nothing written) when there are no points."""
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")  # hosts have no display
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(8, 4.5), dpi=100)
    try:
        steps, losses = zip(*points, strict=True)
        axes.plot(steps, losses, linewidth=1.2)
        axes.set_xlabel("step")
        axes.set_ylabel("train loss")
        axes.set_title(title or "draft training loss")
        axes.grid(alpha=0.3)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", bbox_inches="tight")
    finally:
        pyplot.close(figure)
    write_bytes(path, buffer.getvalue())
    return path
