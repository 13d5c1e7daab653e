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


def plot_compare(document: dict[str, Any], path: Path, title: str = "") -> Path:
    """compare.png: output tokens/s of each kind at each concurrency (vllm; the speedup against none on each bar)
    beside each kind's mean acceptance length on each set. Kinds with no number are named below the figure."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    rows = [row for row in document["rows"] if not row.get("unavailable")]
    missing = [f"{row['label']}: {row['unavailable']}" for row in document["rows"] if row.get("unavailable")]
    sets = ["heldout", *document.get("sets", {})]
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(12, 4.6), dpi=100)
    try:
        places = list(range(len(rows)))
        concurrency = document["concurrency"] if document["backend"] == "vllm" else []
        width = 0.8 / max(len(concurrency), 1)
        for i, c in enumerate(concurrency):
            cells = [next((cell for cell in row.get("speed") or [] if cell["concurrency"] == c), {}) for row in rows]
            bars = left.bar([x + (i - (len(concurrency) - 1) / 2) * width for x in places],
                            [cell.get("tokens_per_s") or 0.0 for cell in cells], width, label=f"concurrency {c}")
            left.bar_label(bars, labels=["" if cell.get("speedup") is None else f"{cell['speedup']:.2f}x"
                                         for cell in cells], fontsize=8)
        left.set_xticks(places, [row["label"] for row in rows])
        left.set_ylabel("output tokens/s (x: against none)")
        if concurrency:
            left.legend()
        else:
            left.text(0.5, 0.5, "tokens/s: vLLM only", ha="center", transform=left.transAxes)
        left.grid(alpha=0.3, axis="y")
        accepting = [row for row in rows if row.get("acceptance")]
        width = 0.8 / max(len(sets), 1)
        for i, name in enumerate(sets):
            right.bar([x + (i - (len(sets) - 1) / 2) * width for x in range(len(accepting))],
                      [((row["acceptance"].get(name) or {}).get("mean_acceptance_length") or 0.0)
                       for row in accepting], width, label=name)
        right.axhline(1.0, color="gray", linestyle="--")
        right.set_xticks(list(range(len(accepting))), [row["label"] for row in accepting])
        right.set_ylabel("mean acceptance length")
        right.legend()
        right.grid(alpha=0.3, axis="y")
        if missing:
            figure.text(0.01, -0.02, "no number: " + "; ".join(missing), fontsize=7, va="top", wrap=True)
        return _save(figure, path, title or "speculators compared")
    finally:
        pyplot.close(figure)


def _save(figure: Any, path: Path, title: str) -> Path:
    """The figure titled and written atomically (a reader never sees half a PNG)."""
    figure.suptitle(title)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    write_bytes(path, buffer.getvalue())
    return path
