"""The pipeline: a run's steps on this host, in the order of the step table (specops.contract.step_table).

This is the face other packages import; each function loads its room only when called (the agent
imports a command's modules on every call, and the rooms pull in pydantic, torch or datasets).

Rooms, one job each (a room imports another only through that room's face):
  commands/    the agent commands' argparse registrations (`step`, `tiny`, `run`, `pipeline`, `fetch-list`, `vllm`)
  engine.py    `pipeline`: the step table's steps in order, on one host or as one node of several
  hosts.py     the nodes of a run across hosts: rendezvous, barriers, file exchange (torch's TCPStore);
               TorchrunNode, this host's member of the training's torchrun group
  patches.py   the patches step
  run/         run config, folders, manifest, fingerprints
  data/        conversations, the prepare step, the embedded tiny target
  target.py    device and dtype choice, loading the target, its dimensions and decoder parts
  extraction/  one plan, one backend interface; hf.py and vllm.py
  vllm/        the extraction server's command, readiness gate and job
  validation/  file checks and fidelity
  training/    vocab, the train command and checkpoints, the steps, metrics, plot
  regenerate/  the target answers the prompts: speculators' regenerate-responses (vllm) or transformers (hf)
  evaluation/  held-out prompts; the draft's acceptance as the target's EAGLE-3 speculator (vLLM or a replay)
  fetch.py     what `invoke fetch` brings home
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specops.pipeline.hosts import TorchrunNode
    from specops.pipeline.run import Hosts, Run


def open_run(name: str, weights: bool = True) -> Run:
    """The named run, its embedded tiny target (if it uses one) generated first; a GGUF target's folder written
    (its weights only with `weights`: the checks before a launch load nothing)."""
    from specops.pipeline.data import open_run as open_with_data

    return open_with_data(name, weights)


def run_pipeline(run_name: str, samples: int | None, skip: frozenset[str], backend: str | None,
                 hosts: Hosts | None = None, training: TorchrunNode | None = None,
                 **alone: Any) -> tuple[int, dict[str, Any]]:
    """Every step of a run, in the step table's order, each skipped when unchanged: (exit code, summary).
    `hosts`: this host's node of a run across several (pipeline.hosts); `training`: its torchrun node;
    `alone`: `only`, `epochs`, `fresh` (engine.run_pipeline: the engine entered with one step)."""
    from specops.pipeline.engine import run_pipeline as run_steps

    return run_steps(run_name, samples, skip, backend, hosts, training, **alone)


__all__ = ["open_run", "run_pipeline"]
