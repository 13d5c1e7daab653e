"""acceptance.png, next to loss.png: acceptance per draft position, and acceptance length per epoch."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specops.host.atomic import write_bytes

if TYPE_CHECKING:
    from specops.pipeline.run import Acceptance

PLOT_FILE = "acceptance.png"


def plot_acceptance(trained: Acceptance, untrained: Acceptance | None, epochs: list[Acceptance],
                    path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (left, right) = pyplot.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    try:
        positions = range(1, len(trained["per_position_acceptance"]) + 1)
        left.plot(positions, trained["per_position_acceptance"], marker="o", label=f"trained ({trained['checkpoint']})")
        if untrained is not None:
            left.plot(positions, untrained["per_position_acceptance"], marker="x", label="untrained")
        left.set_xlabel("draft position")
        left.set_ylabel("share of drafts accepted")
        left.set_xticks(list(positions))
        left.set_ylim(0, 1)
        left.legend()
        left.grid(alpha=0.3)
        if epochs:
            numbers = [int(row["checkpoint"]) for row in epochs]
            right.plot(numbers, [row["mean_acceptance_length"] for row in epochs], marker="o", label="trained")
            right.set_xticks(numbers)
        else:
            right.plot([trained["checkpoint"]], [trained["mean_acceptance_length"]], marker="o", label="trained")
        if untrained is not None:
            right.axhline(untrained["mean_acceptance_length"], color="gray", linestyle="--", label="untrained")
        right.set_xlabel("epoch")
        right.set_ylabel("mean acceptance length")
        right.legend()
        right.grid(alpha=0.3)
        return _save(figure, path, title or "draft acceptance")
    finally:
        pyplot.close(figure)


def plot_sweep(document: dict[str, Any], path: Path, title: str = "") -> Path:
    """sweep.png: acceptance length by speculative tokens; the speedup (vllm) or the acceptance by draft
    position (hf) beside it; one line per concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    cells = document["cells"]
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    try:
        for concurrency in document["concurrency"]:
            row = [cell for cell in cells if cell["concurrency"] == concurrency]
            ks = [cell["num_speculative_tokens"] for cell in row]
            label = f"concurrency {concurrency}"
            left.plot(ks, [cell["mean_acceptance_length"] for cell in row], marker="o", label=label)
            if document["backend"] == "vllm":
                right.plot(ks, [cell.get("speedup") or 0.0 for cell in row], marker="o", label=label)
        left.set_xlabel("speculative tokens (k)")
        left.set_ylabel("mean acceptance length")
        left.set_xticks(document["num_speculative_tokens"])
        left.legend()
        left.grid(alpha=0.3)
        if document["backend"] == "vllm":
            right.axhline(1.0, color="gray", linestyle="--", label="no speculation")
            right.set_xlabel("speculative tokens (k)")
            right.set_ylabel("speedup (tokens/s with the draft / without)")
            right.set_xticks(document["num_speculative_tokens"])
        else:
            for cell in cells:
                positions = range(1, len(cell["per_position_acceptance"]) + 1)
                right.plot(positions, cell["per_position_acceptance"], marker="o",
                           label=f"k={cell['num_speculative_tokens']}")
            right.set_xlabel("draft position")
            right.set_ylabel("share of drafts accepted")
            right.set_ylim(0, 1)
        right.legend()
        right.grid(alpha=0.3)
        return _save(figure, path, title or "speculative settings")
    finally:
        pyplot.close(figure)


def _save(figure: Any, path: Path, title: str) -> Path:
    """The figure titled and written atomically (a reader never sees half a PNG)."""
    figure.suptitle(title)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    write_bytes(path, buffer.getvalue())
    return path
