"""Who answers regenerate's prompts: one interface, two backends, picked by name in one place (`backend_for`).

- hf    transformers in fixed batches in this process (hf.py)
- vllm  speculators' `regenerate-responses` against the run's server (vllm.py)

Both write speculators' responses.jsonl and responses.errors.jsonl into a folder. The name comes from the
run's effective settings (`EffectiveSettings.regenerate_backend`, resolved once); no backend default is
decided here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from specops.contract.errors import BadInput

if TYPE_CHECKING:
    from specops.pipeline.run import Run

BACKENDS = ("hf", "vllm")

Source = list[dict[str, Any]]  # source.jsonl's rows: {"id", "line", "messages"}


class Backend(Protocol):
    name: str

    def answer(self, run: Run, folder: Path, source: Source, *, span: tuple[int, int] | None = None,
               samples: int | None = None) -> dict[str, Any]:
        """Answer `source` (or only its rows [start, stop): a host's share) into `folder`'s response files.

        samples: only until prepare can take that many rows (then the report's `answered` says how many
        source rows were asked); what else the report holds is the backend's own detail."""
        ...


@dataclass(frozen=True)
class HfBackend:
    name: ClassVar[str] = "hf"

    def answer(self, run: Run, folder: Path, source: Source, *, span: tuple[int, int] | None = None,
               samples: int | None = None) -> dict[str, Any]:
        from specops.pipeline.regenerate.hf import regenerate_hf

        # a share is a run of whole one-host batches: the same rows and seeds as one host's run
        return regenerate_hf(run, folder, source, span=span, samples=samples)


@dataclass(frozen=True)
class VllmBackend:
    name: ClassVar[str] = "vllm"
    stop_server: bool = False  # stop the run's server job afterwards
    port: int | None = None  # the server's port (default: the run's vllm.port)

    def answer(self, run: Run, folder: Path, source: Source, *, span: tuple[int, int] | None = None,
               samples: int | None = None) -> dict[str, Any]:
        from specops.pipeline.regenerate.vllm import regenerate_vllm

        if span is None:
            return regenerate_vllm(run, folder, source, samples=samples, stop_server=self.stop_server,
                                   port=self.port)
        import json

        from specops.host import atomic
        from specops.pipeline.regenerate.output import ERRORS_FILE, RESPONSES_FILE
        from specops.pipeline.regenerate.source import SOURCE_FILE

        subset = source[span[0]:span[1]]
        text = "".join(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n" for row in subset)
        atomic.write_text(folder / SOURCE_FILE, text)  # speculators has no rank flag: the share's own source
        if subset:
            return regenerate_vllm(run, folder, subset, stop_server=self.stop_server, port=self.port, share=True)
        for name in (ERRORS_FILE, RESPONSES_FILE):
            atomic.write_text(folder / name, "")
        return {}


def backend_for(name: str, *, stop_server: bool = False, port: int | None = None) -> Backend:
    """The backend of that name (the run's settings' regenerate_backend); stop_server and port are the
    vllm backend's (the hf backend has no server and leaves them)."""
    if name == "hf":
        return HfBackend()
    if name == "vllm":
        return VllmBackend(stop_server=stop_server, port=port)
    raise BadInput(f"--backend: {name!r} is not one of {', '.join(BACKENDS)}")
