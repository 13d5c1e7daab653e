"""A run's plan on a host: its figures per hidden-state mode, where server and trainer go, whether the
run's own mode fits, and the mode the plan recommends with the reason.

`make_plan(target, run, host, rates)` takes plain values (what `pipeline.plan` reads from the run, the
host and earlier jobs) and computes everything else here, without importing anything heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specops.planning import _sizes as sizes
from specops.planning._parallel import ModelShape, ParallelSizes, resolve_sizes, tp_fits_heads
from specops.planning._target import DTYPE_BYTES, TargetFacts

MODES = ("offline", "online", "hybrid")
PLACEMENTS = ("split", "shared")
DISK_SHARE = 0.9  # leave a tenth of the free disk for logs, evaluation and what else the host writes
SHARED_MARGIN = 0.02  # of each GPU, between the server's share and the trainer's when they share GPUs


@dataclass(frozen=True)
class HostFacts:
    gpus: int
    gpu_memory_bytes: int | None   # the smallest GPU's total memory
    disk_free_bytes: int           # on the filesystem of the run's folder
    source: str = "measured"       # "measured" (this host), or what overrode it (the run config's plan:)


@dataclass(frozen=True)
class RunFacts:
    name: str
    layer_ids: list[int]
    hidden_state_dtype: str
    samples: int
    tokens: int
    tokens_source: str
    max_seq_len: int
    loss_tokens: int | None = None  # the answers' tokens in the rows: what a draft learns from
    loss_tokens_source: str | None = None
    epochs: int = 10
    mode: str = "offline"
    disk_budget_bytes: int | None = None
    placement: str | None = None
    backend: str = "vllm"
    tensor_parallel: int | None = None
    data_parallel: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_dtype_bytes: int | None = None  # None: the served dtype's
    draft_vocab: int = 32000
    draft_layers: int = 1
    ttt_steps: int = 3
    tokens_per_step: int = 8192
    optimizer: str = "muon"
    expert_parallel: bool = False
    hidden_state_backend: str = "file"  # hidden_states.backend: file | fp8 | mooncake


@dataclass(frozen=True)
class Rate:
    tokens_per_s: float | None
    source: str

    def seconds(self, tokens: float) -> float | None:
        return tokens / self.tokens_per_s if self.tokens_per_s else None

    def to_dict(self) -> dict[str, Any]:
        return {"tokens_per_s": self.tokens_per_s, "source": self.source}


@dataclass(frozen=True)
class Rates:
    extract: Rate = Rate(None, "unknown")
    train: Rate = Rate(None, "unknown")
    serve: Rate = Rate(None, "unknown")  # hidden states the server hands the trainer online


@dataclass
class Plan:
    run: RunFacts
    host: HostFacts
    target: TargetFacts
    rates: Rates
    figures: dict[str, Any] = field(default_factory=dict)
    modes: dict[str, dict[str, Any]] = field(default_factory=dict)
    recommended: dict[str, Any] = field(default_factory=dict)
    # every hidden-state backend x mode, each with its disk, loads, time and whether it fits
    rows: list[dict[str, Any]] = field(default_factory=list)
    # when the run's own backend and mode do not fit: the nearest that do (most rows, fp8, more hosts)
    alternatives: list[dict[str, Any]] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """Why the run's own mode does not fit on this host ([] when it does)."""
        return list(self.modes[self.run.mode]["problems"])

    def to_dict(self) -> dict[str, Any]:
        run = self.run
        return {
            "ok": not self.problems, "run": run.name, "mode": run.mode, "problems": self.problems,
            "recommended": self.recommended,
            "host_facts": {"gpus": self.host.gpus, "gpu_memory_bytes": self.host.gpu_memory_bytes,
                     "disk_free_bytes": self.host.disk_free_bytes, "source": self.host.source},
            "target": {**self.target.to_dict(), "memory_bytes": self.target.memory_bytes(run.hidden_state_dtype),
                       "compute_dtype": run.hidden_state_dtype},
            "data": {"samples": run.samples, "tokens": run.tokens, "tokens_source": run.tokens_source,
                     "loss_tokens": run.loss_tokens, "loss_tokens_source": run.loss_tokens_source,
                     "max_seq_len": run.max_seq_len, "epochs": run.epochs},
            **self.figures,
            "modes": self.modes,
            "backend": run.hidden_state_backend, "rows": self.rows, "alternatives": self.alternatives,
            "rates": {"extract": self.rates.extract.to_dict(), "train": self.rates.train.to_dict(),
                      "serve": self.rates.serve.to_dict()},
        }


def fits(plan: Plan) -> bool:
    """Whether the run's own hidden-state mode fits the host (`plan.problems` says why not)."""
    return not plan.problems


def human(count: float | None) -> str:
    """Bytes as a person reads them: decimal units (disks are sold so; GPUs in GiB are shown as such)."""
    if count is None:
        return "-"
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if abs(count) >= size:
            return f"{count / size:.2f} {unit}"
    return f"{int(count)} B"


def _gib(count: int) -> str:
    return f"{count / sizes.GIB:.1f} GiB"


def _hidden_states(target: TargetFacts, run: RunFacts, backend: str | None = None) -> dict[str, Any]:
    """The hidden states' bytes as `backend` (default: the run's) keeps them: fp8 one byte an element and a
    float32 scale per token."""
    layers = len(run.layer_ids)
    dtype = sizes.stored_dtype(run.hidden_state_dtype, backend or run.hidden_state_backend)
    per_token = sizes.hidden_state_bytes_per_token(layers, target.hidden, dtype)
    files = sizes.hidden_state_file_bytes(run.tokens, run.samples, layers, target.hidden, dtype)
    in_flight = min(sizes.ONLINE_SAMPLES_IN_FLIGHT, run.samples) * sizes.hidden_state_file_bytes(
        run.max_seq_len, 1, layers, target.hidden, dtype)
    return {"layer_ids": run.layer_ids, "layers": layers, "hidden": target.hidden, "dtype": dtype,
            "bytes_per_token": per_token, "file_bytes_per_token": per_token + sizes.TOKEN_ID_BYTES,
            "bytes_total": per_token * run.tokens, "file_bytes_total": files, "in_flight_bytes": in_flight}


def _draft(target: TargetFacts, run: RunFacts, on_gpu: bool) -> dict[str, Any]:
    aux = len(run.layer_ids) - 1
    draft = sizes.draft_size(target.hidden, target.heads, target.kv_heads, target.head_dim, target.intermediate,
                             target.vocab, run.draft_vocab, run.draft_layers, aux)
    activations = sizes.activation_bytes(run.tokens_per_step, target.hidden, target.heads, target.kv_heads,
                                         target.head_dim, target.intermediate, run.draft_vocab, aux, run.ttt_steps)
    memory = sizes.trainer_memory(draft, run.optimizer, activations, on_gpu)
    checkpoint = draft.checkpoint_bytes(run.optimizer)  # speculators keeps every epoch's folder
    return {"draft_params": draft.params, "trainable_params": draft.trainable, "frozen_params": draft.frozen,
            "optimizer": run.optimizer, "tokens_per_step": run.tokens_per_step, **memory.to_dict(),
            "checkpoint_bytes": checkpoint, "_draft": draft}


def _server_sizes(target: TargetFacts, run: RunFacts, host: HostFacts) -> ParallelSizes:
    if run.backend == "hf":  # transformers in one process per GPU: each holds the whole target
        return ParallelSizes(1, max(host.gpus, 1))
    shape = ModelShape(heads=target.heads, kv_heads=target.kv_heads, experts=target.experts,
                       moe_intermediate=target.moe_intermediate, weight_bytes=target.weight_bytes)
    return resolve_sizes(run.tensor_parallel, run.data_parallel, host.gpus, shape, host.gpu_memory_bytes)


def _kv_per_gpu(target: TargetFacts, run: RunFacts, tensor: int) -> int:
    kv_bytes = run.kv_dtype_bytes or DTYPE_BYTES.get(run.hidden_state_dtype, 2)
    return sizes.kv_bytes_per_token_per_gpu(target.kv_bytes_per_token(kv_bytes), target.kv_lora_rank is not None,
                                            target.kv_heads, tensor)


def _server(target: TargetFacts, run: RunFacts, host: HostFacts, tensor: int, share: float) -> dict[str, Any]:
    kv = _kv_per_gpu(target, run, tensor)
    memory = host.gpu_memory_bytes or 0
    kv_tokens = sizes.server_kv_tokens(target.weight_bytes, tensor, memory, share, kv)
    problems = []
    if kv_tokens < run.max_seq_len:
        need = target.weight_bytes // tensor + sizes.SERVER_RESERVE_BYTES + kv * run.max_seq_len
        problems.append(f"the server needs {_gib(need)} per GPU at tensor parallel {tensor} (weights "
                        f"{_gib(target.weight_bytes // tensor)}, KV for one {run.max_seq_len}-token sequence, "
                        f"reserve), {share:.2f} of {_gib(memory)} is {_gib(int(share * memory))}")
    return {"tensor_parallel": tensor, "weights_per_gpu_bytes": target.weight_bytes // tensor,
            "kv_bytes_per_token_per_gpu": kv, "kv_tokens": max(kv_tokens, 0), "gpu_memory_utilization": share,
            "problems": problems}


def _smallest_tensor(target: TargetFacts, run: RunFacts, host: HostFacts, limit: int) -> int | None:
    shape = ModelShape(heads=target.heads, kv_heads=target.kv_heads)
    for tensor in range(1, limit + 1):
        if tp_fits_heads(tensor, shape) and not _server(target, run, host, tensor,
                                                       run.gpu_memory_utilization)["problems"]:
            return tensor
    return None


def _placement(target: TargetFacts, run: RunFacts, host: HostFacts, trainer_bytes: int,
               mode: str) -> dict[str, Any]:
    """Where the server and the trainer run on this host for `mode`, and what does not fit."""
    if host.gpus == 0 or not host.gpu_memory_bytes:
        return {"kind": "cpu", "server_gpus": 0, "trainer_gpus": 0, "problems": [],
                "why": "no GPU: the server and the trainer share the CPU"}
    memory = host.gpu_memory_bytes
    trainer_problem = ([f"one training rank needs {_gib(trainer_bytes)}, a GPU has {_gib(memory)}"]
                       if trainer_bytes > memory else [])
    sized = _server_sizes(target, run, host)
    if mode == "offline":  # extraction, then training: each has every GPU in turn
        server = _server(target, run, host, sized.tensor, run.gpu_memory_utilization)
        return {"kind": "sequential", "server_gpus": sized.gpus, "trainer_gpus": host.gpus, "server": server,
                "problems": server["problems"] + trainer_problem,
                "why": "extraction first on the server's GPUs, then training on every GPU"}
    smallest = _smallest_tensor(target, run, host, host.gpus)
    split_problems = list(trainer_problem)
    if smallest is None:
        split_problems.append(f"no tensor-parallel size over this host's {host.gpus} GPUs holds the server")
    elif smallest >= host.gpus:
        split_problems.append(f"the server needs all {host.gpus} GPUs for its weights: none left for the trainer")
    share = round(1 - trainer_bytes / memory - SHARED_MARGIN, 3)
    shared_server = _server(target, run, host, sized.tensor, min(share, run.gpu_memory_utilization))
    shared_problems = trainer_problem + shared_server["problems"]
    choice = run.placement or ("split" if not split_problems else "shared")
    if choice == "split":
        tensor = smallest or host.gpus
        server = _server(target, run, host, tensor, run.gpu_memory_utilization)
        return {"kind": "split", "server_gpus": tensor, "trainer_gpus": max(host.gpus - tensor, 0), "server": server,
                "problems": split_problems, "chosen_by": "run config" if run.placement else "plan",
                "why": f"the server on {tensor} GPU(s), the trainer on the other {host.gpus - tensor}"}
    return {"kind": "shared", "server_gpus": sized.gpus, "trainer_gpus": host.gpus, "server": shared_server,
            "problems": shared_problems, "chosen_by": "run config" if run.placement else "plan",
            "why": (f"every GPU holds a server share ({shared_server['gpu_memory_utilization']:.2f}) and a training "
                    f"rank ({_gib(trainer_bytes)})"
                    + (f"; split is impossible: {split_problems[-1]}" if split_problems and not run.placement else ""))}


def _times(run: RunFacts, rates: Rates, on_disk_share: float) -> dict[str, float | None]:
    """Seconds per phase: extraction of the share kept on disk, then `epochs` passes of training, where
    states not on disk come from the server as fast as the slower of server and trainer allows."""
    tokens, epochs = run.tokens, run.epochs
    extract = rates.extract.seconds(tokens * on_disk_share) if on_disk_share else 0.0
    trained = rates.train.seconds(tokens * on_disk_share)
    online_rate = min((rate for rate in (rates.serve.tokens_per_s or rates.extract.tokens_per_s,
                                         rates.train.tokens_per_s) if rate), default=None)
    served = (tokens * (1 - on_disk_share) / online_rate) if online_rate else None
    if on_disk_share == 1:
        served = 0.0
    train = epochs * (trained + served) if trained is not None and served is not None else None
    total = extract + train if extract is not None and train is not None else None
    return {"extract_s": extract, "train_s": train, "total_s": total}


def _modes(target: TargetFacts, run: RunFacts, host: HostFacts, rates: Rates, states: dict[str, Any],
           trainer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each mode's disk, placement, problems and time for the hidden states `states` (one backend's bytes)."""
    prepared = run.tokens * sizes.PREPARED_BYTES_PER_TOKEN
    checkpoints = run.epochs * trainer["checkpoint_bytes"]
    other = prepared + checkpoints
    usable = int(DISK_SHARE * host.disk_free_bytes)
    offline_bytes = states["file_bytes_total"]
    hybrid_budget = run.disk_budget_bytes
    if hybrid_budget is None:  # what the plan would keep: the usable disk less everything else
        hybrid_budget = max(usable - other - states["in_flight_bytes"], 0)
    modes = {}
    for mode in MODES:
        budget = hybrid_budget if mode == "hybrid" else run.disk_budget_bytes
        states_on_disk = sizes.on_disk(mode, offline_bytes, budget, states["in_flight_bytes"])
        kept = 1.0 if mode == "offline" or not offline_bytes else 0.0 if mode == "online" else min(
            (budget or 0) / offline_bytes, 1.0)
        problems: list[str] = []
        if mode == "offline" and run.disk_budget_bytes is not None and offline_bytes > run.disk_budget_bytes:
            problems.append(f"offline writes {human(offline_bytes)} of hidden states, over the disk budget of "
                            f"{human(run.disk_budget_bytes)} (hidden_states.disk_budget_gb): use hybrid or online")
        if states_on_disk + other > usable:
            problems.append(f"{mode} needs {human(states_on_disk + other)} on disk (hidden states "
                            f"{human(states_on_disk)}, prepared rows and checkpoints {human(other)}), "
                            f"{human(host.disk_free_bytes)} free (up to {DISK_SHARE:.0%} used)")
        placement = _placement(target, run, host, trainer["total_bytes"], mode)
        problems += placement["problems"]
        modes[mode] = {"hidden_state_bytes_on_disk": states_on_disk, "disk_bytes": states_on_disk + other,
                       "on_disk_share": round(kept, 4), "budget_bytes": budget if mode != "offline" else
                       run.disk_budget_bytes, "placement": placement, "fits": not problems,
                       "problems": problems, **_times(run, rates, kept)}
    return modes


def _server_figures(target: TargetFacts, run: RunFacts, host: HostFacts) -> dict[str, Any]:
    sized = _server_sizes(target, run, host)
    kv = target.kv_bytes_per_token(run.kv_dtype_bytes or DTYPE_BYTES.get(run.hidden_state_dtype, 2))
    figures: dict[str, Any] = {"tensor_parallel": sized.tensor, "data_parallel": sized.data,
                               "weight_bytes": target.weight_bytes, "kv_bytes_per_token": kv,
                               "kv_layout": "mla latent" if target.kv_lora_rank else "key and value per head"}
    if host.gpus and host.gpu_memory_bytes:
        figures.update({key: value for key, value in _server(target, run, host, sized.tensor,
                                                             run.gpu_memory_utilization).items()
                        if key != "problems"})
    return figures


def _recommend(plan: Plan) -> dict[str, Any]:
    modes, run = plan.modes, plan.run
    states = plan.figures["hidden_states"]["file_bytes_total"]
    free = plan.host.disk_free_bytes
    if modes["online"]["fits"] and run.epochs == 1:
        return {"mode": "online", "reason": "one epoch: each hidden state is read once, so writing it to disk "
                "first buys nothing; the trainer takes them from the server as they are made"}
    if modes["offline"]["fits"]:
        return {"mode": "offline", "reason": (
            f"the hidden states ({human(states)}) fit in {human(free)} free"
            + (f" and in the budget of {human(run.disk_budget_bytes)}" if run.disk_budget_bytes else "")
            + f": extracted once and read by all {run.epochs} epochs, where online would run the target "
              f"through every sample again in each epoch ({run.epochs}x the target's work)")}
    hybrid = modes["hybrid"]
    if hybrid["fits"] and hybrid["on_disk_share"] > 0:
        return {"mode": "hybrid", "reason": (
            f"only {human(hybrid['hidden_state_bytes_on_disk'])} of the {human(states)} of hidden states fit "
            f"({hybrid['on_disk_share']:.0%}): keep those on disk, the server makes the rest each epoch; "
            f"placement {hybrid['placement']['kind']}")}
    if modes["online"]["fits"]:
        return {"mode": "online", "reason": (
            f"the hidden states ({human(states)}) do not fit in {human(free)} free: the server makes them as the "
            f"trainer needs them; placement {modes['online']['placement']['kind']}")}
    first = next(iter(modes["online"]["problems"] or modes["offline"]["problems"]), "")
    return {"mode": None, "reason": f"no mode fits this host: {first}"}
