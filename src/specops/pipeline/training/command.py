"""The train step's command: the draft trained with `speculators train` (speculators 0.9.0), of the kind the run's
`draft.method` names (`--speculator-type`; eagle3 when unset, its argv as it always was).

The command is built here from a `TrainPlan` (pure, unit-tested) and run as a subprocess whose output
goes to stderr and, appended, to `<save_path>/train.log` (metrics.py reads it back). speculators resumes
by itself from the highest numbered checkpoint folder under the save path; this module only reads what
is there to say so, moves a half-written newest checkpoint aside (speculators would trust it), and for
`--fresh` moves the old folder aside to `checkpoints-<timestamp>` (never deleting it) and starts over
in an empty one, so the run's checkpoints always live at the same path.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specops.contract.errors import BadInput
from specops.pipeline.hosts import TorchrunNode

LOG_FILE = "train.log"
CHECKPOINT_FILES = ("model.safetensors", "config.json", "optimizer_state_dict.pt", "training_state.json")
LOSS_IMPLEMENTATIONS = ("auto", "eager", "fused")
ATTN_IMPLEMENTATIONS = ("auto", "sdpa", "eager", "simple_flex_attention")
OPTIMIZERS = ("adamw", "muon")


@dataclass(frozen=True)
class Generation:
    """Online and hybrid modes: rows without a file are asked of the run's vLLM server."""

    endpoint: str  # the server's OpenAI base URL
    request_timeout_s: float = 120.0  # --request-timeout, per request
    max_retries: int = 1  # --max-retries, per request
    max_consecutive_failures: int = 3  # --max-consecutive-generation-failures (the circuit breaker)

    def args(self) -> list[str]:
        return ["--on-missing", "generate", "--vllm-endpoint", self.endpoint,
                "--request-timeout", repr(float(self.request_timeout_s)), "--max-retries", str(self.max_retries),
                "--max-consecutive-generation-failures", str(self.max_consecutive_failures)]


@dataclass(frozen=True)
class TrainPlan:
    """Everything `speculators train` needs, resolved to concrete values and paths."""

    verifier: str
    data_path: Path
    hidden_states_path: Path
    save_path: Path
    target_layer_ids: tuple[int, ...]  # auxiliary layers only, never the final one
    draft_vocab_size: int
    d2t_path: Path | None = None
    t2d_path: Path | None = None
    trust_remote_code: bool = False
    num_layers: int | None = 1  # None: speculators' default for the kind (mtp: the target's own MTP layers)
    ttt_steps: int = 3
    epochs: int = 1
    lr: float = 1e-4
    loss_implementation: str = "auto"  # auto: eager on CPU, speculators' default (fused) on GPU
    draft_attn_impl: str = "auto"  # auto: sdpa on CPU, speculators' default on GPU
    total_seq_len: int | None = None
    optimizer: str | None = None  # None: speculators' default (Muon in 0.9.0)
    log_freq: int | None = None  # None: speculators' default (every step)
    loader_workers: int | None = None  # None: speculators' default (12) on a GPU, 0 on a CPU host
    extra_args: tuple[str, ...] = field(default=())
    generation: Generation | None = None  # None: offline, every row's file on disk (--on-missing raise)
    # speculators' --hidden-states-backend (an hs_connectors backend: fp8 reads the quantised files dequantised,
    # mooncake a store); None: its default, file
    hidden_states_backend: str | None = None
    # the kind of draft (--speculator-type) and its own settings; None: speculators' default for the kind
    speculator_type: str = "eagle3"
    block_size: int | None = None  # dflash, dflash2, dspark, xpress
    num_depths: int | None = None  # peagle
    num_speculative_steps: int | None = None  # mtp


# What each kind's own setting is called on speculators' command line (train/config/schema.py).
KIND_FLAGS = {"block_size": "--block-size", "num_depths": "--num-depths",
              "num_speculative_steps": "--num-speculative-steps"}


# Kinds that draft in the target's whole vocabulary: mtp through the target's own head; dflash2 refuses any
# other (speculators 0.9.0 models/dflash2/core.py: "DFlash2 currently requires the full verifier vocabulary",
# measured). speculators then builds no mapping: no --draft-vocab-size, no d2t/t2d.
FULL_VOCABULARY = ("mtp", "dflash2")


def uses_vocab_mapping(kind: str) -> bool:
    """Whether the kind drafts in a smaller vocabulary through the vocab step's d2t/t2d (every kind but those of
    FULL_VOCABULARY)."""
    return kind not in FULL_VOCABULARY


def aux_layer_ids(extraction_layer_ids: list[int] | tuple[int, ...], num_hidden_layers: int) -> tuple[int, ...]:
    """The layer ids speculators wants: the captured ones without the final layer it appends itself."""
    ids = tuple(extraction_layer_ids)
    if ids and ids[-1] == num_hidden_layers:
        ids = ids[:-1]
    if any(layer >= num_hidden_layers or layer < 0 for layer in ids):
        raise BadInput(f"target layer ids {list(ids)} must lie in [0, {num_hidden_layers}) "
                       "besides the final layer")
    return ids


def torchrun_launcher(gpus: int, nodes: TorchrunNode | None) -> list[str]:
    """torchrun's own arguments: one process per GPU (one on a CPU host), standalone or one of `nodes`."""
    per_node = f"--nproc_per_node={max(gpus, 1)}"
    if nodes is None:
        return ["torchrun", "--standalone", per_node]
    return ["torchrun", f"--nnodes={nodes.count}", f"--node-rank={nodes.rank}", per_node,
            "--rdzv-backend=c10d", f"--rdzv-endpoint={nodes.endpoint}", f"--rdzv-id={nodes.rdzv_id}",
            "--max-restarts=0",  # a lost node ends the group; the control side relaunches it whole
            *([f"--local-addr={nodes.local_addr}", f"--rdzv-conf=is_host={int(nodes.rank == 0)}"]
              if nodes.local_addr else [])]


def collectives_environment(nodes: TorchrunNode) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME for a node: its interface, named or found from its address.

    Empty without either (torch's own choice). An address no interface of this host holds, or an interface
    it lacks, is bad input: the inventory names another host's, or the host's network changed."""
    from specops.host.netif import addresses, interface_of

    holder = None
    if nodes.local_addr is not None:
        holder = interface_of(nodes.local_addr)
        if holder is None:
            raise BadInput(f"--local-addr: {nodes.local_addr} is not an address of this host")
    if nodes.interface is not None and nodes.interface not in (present := addresses()):
        raise BadInput(f"--interface: {nodes.interface} is not an interface of this host "
                       f"(it has {', '.join(sorted(present))})")
    interface = nodes.interface or holder
    return {} if interface is None else {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}


def build_train_command(plan: TrainPlan, gpus: int, nodes: TorchrunNode | None = None) -> list[str]:
    """argv of the training run: `speculators train ...`, or torchrun over `gpus` GPUs when gpus > 1,
    or torchrun as one node of several (`nodes`) whatever the GPU count (gloo on a CPU host)."""
    if plan.loss_implementation not in LOSS_IMPLEMENTATIONS:
        raise BadInput(f"train.loss_implementation: {plan.loss_implementation!r} is not one of "
                       f"{', '.join(LOSS_IMPLEMENTATIONS)}")
    if plan.draft_attn_impl not in ATTN_IMPLEMENTATIONS:
        raise BadInput(f"train.draft_attn_impl: {plan.draft_attn_impl!r} is not one of "
                       f"{', '.join(ATTN_IMPLEMENTATIONS)}")
    if plan.optimizer is not None and plan.optimizer not in OPTIMIZERS:
        raise BadInput(f"train.optimizer: {plan.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    if plan.log_freq is not None and (not isinstance(plan.log_freq, int) or plan.log_freq < 1):
        raise BadInput(f"train.log_freq: {plan.log_freq!r} is not a whole number > 0")
    if plan.loader_workers is not None and (not isinstance(plan.loader_workers, int) or plan.loader_workers < 0):
        raise BadInput(f"train.loader_workers: {plan.loader_workers!r} is not a whole number >= 0")
    if (plan.d2t_path is None) != (plan.t2d_path is None):
        raise BadInput("d2t and t2d paths go together: give both or neither")
    if nodes is not None and nodes.problems():
        raise BadInput(nodes.problems()[0])
    kind = plan.speculator_type
    if kind == "mtp" and plan.num_layers is not None:
        raise BadInput("an mtp draft reuses the target's MTP layers: no num_layers")
    if not uses_vocab_mapping(kind) and plan.d2t_path is not None:
        raise BadInput(f"a {kind} draft drafts in the target's whole vocabulary: no d2t/t2d")
    if gpus > 1 or nodes is not None:
        launcher = [*torchrun_launcher(gpus, nodes), "-m", "speculators.train"]
    else:
        launcher = ["speculators", "train"]
    args = [
        "--verifier-name-or-path", plan.verifier,
        "--data-path", str(plan.data_path),
        "--hidden-states-path", str(plan.hidden_states_path),
        *(["--hidden-states-backend", plan.hidden_states_backend]
          if plan.hidden_states_backend not in (None, "file") else []),
        # offline: never let the trainer call an inference server
        *(plan.generation.args() if plan.generation else ["--on-missing", "raise"]),
        "--save-path", str(plan.save_path),
        *(["--draft-vocab-size", str(plan.draft_vocab_size)] if uses_vocab_mapping(kind) else []),
        *(["--num-layers", str(plan.num_layers)] if plan.num_layers is not None else []),
        "--ttt-steps", str(plan.ttt_steps),
        "--epochs", str(plan.epochs),
        "--lr", repr(float(plan.lr)),
    ]
    if kind != "eagle3":  # speculators' default; eagle3's argv stays what it always was
        args += ["--speculator-type", kind]
    for key, flag in KIND_FLAGS.items():
        if getattr(plan, key) is not None:
            args += [flag, str(getattr(plan, key))]
    if plan.target_layer_ids:
        args += ["--target-layer-ids", *map(str, plan.target_layer_ids)]
    if plan.trust_remote_code:
        args.append("--trust-remote-code")
    if plan.d2t_path is not None and plan.t2d_path is not None:
        args += ["--d2t-path", str(plan.d2t_path), "--t2d-path", str(plan.t2d_path)]
    if plan.total_seq_len is not None:
        args += ["--total-seq-len", str(plan.total_seq_len)]
    if plan.optimizer is not None:
        args += ["--optimizer", plan.optimizer]
    if plan.log_freq is not None:
        args += ["--log-freq", str(plan.log_freq)]
    on_cpu = gpus == 0
    if plan.loader_workers is not None:
        args += ["--num-workers", str(plan.loader_workers)]
    elif on_cpu:
        args += ["--num-workers", "0"]  # each spawned loader worker re-imports torch; a CPU host has few cores
    loss = plan.loss_implementation
    if loss == "auto":
        loss = "eager" if on_cpu else ""
    if loss:
        args += ["--loss-implementation", loss]
    attn = plan.draft_attn_impl
    if attn == "auto":
        attn = "sdpa" if on_cpu and kind != "mtp" else ""  # mtp: speculators refuses any but its own
    if attn:
        args += ["--draft-attn-impl", attn]
    if on_cpu and kind != "eagle3":
        # on a CPU no autocast runs: DFlash fed bf16 hidden states to its fp32 fc ("expected m1 and m2 to have
        # the same dtype", measured); EAGLE-3 casts them itself, and keeps its argv
        args += ["--hidden-states-dtype", "float32"]
    return launcher + args + list(plan.extra_args)


FIXED_LOSS_TILE = "SPECOPS_FIXED_LOSS_TILE"
INDUCTOR_DETERMINISTIC = "TORCHINDUCTOR_DETERMINISTIC"
# What the trainer's numerics would otherwise take from the machine's state (its GPU's timings, what an earlier
# run left in the Triton and Inductor caches) rather than from the run: each pinned here unless the host's own
# environment names it ("0" gives the choice back to timing). bench/README.md, issues 33 and 53.
PINNED = {
    # the fused loss's row tile: one per vocabulary width (patch fixed-tile of speculators-0.9.0-fused-loss),
    # not the one triton.autotune times fastest on a fresh cache
    FIXED_LOSS_TILE: "1",
    # Inductor's reduction kernels: one config by rule, not the fastest by timing on a cold cache (tiles reduce in
    # different orders); a warm cache hands a run the choices an earlier one timed (bench/train_caches.py)
    INDUCTOR_DETERMINISTIC: "1",
}


def train_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the trainer: wide, plain log lines so metrics parse back in one piece, and the
    numerics pinned to the run (PINNED): on fresh machines, or a second run over an earlier run's caches,
    timed choices differ and so do the drafts (bench/README.md, issues 33 and 53)."""
    env = dict(os.environ if base is None else base)
    env.setdefault("COLUMNS", "240")
    for name, value in PINNED.items():
        env.setdefault(name, value)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def pinned_numerics(env: dict[str, str]) -> dict[str, str | None]:
    """What the trainer ran with, for the record: each PINNED variable's value in `env` (a trainer's
    environment, train_environment's), None where it is unset."""
    return {name: env.get(name) for name in PINNED}


# --- checkpoints on disk -------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckpointState:
    folder: Path
    newest_epoch: int | None  # highest numbered, complete checkpoint folder
    mid_epoch_step: int | None  # local step when that checkpoint was written mid-epoch
    global_step: int | None
    interrupted: bool  # an interrupted/ save exists (speculators does not resume from it)

    def resume_note(self) -> str | None:
        if self.newest_epoch is None:
            return None
        if self.mid_epoch_step:
            return f"resuming from epoch {self.newest_epoch} (mid-epoch, step {self.mid_epoch_step})"
        return f"resuming from epoch {self.newest_epoch + 1} (epoch {self.newest_epoch} complete)"

    def as_dict(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "newest_epoch": self.newest_epoch,
                "mid_epoch_step": self.mid_epoch_step, "global_step": self.global_step,
                "interrupted": self.interrupted, "resume": self.resume_note()}


def _numbered(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    found = [entry for entry in folder.iterdir()
             if entry.is_dir() and not entry.is_symlink() and entry.name.isdigit()]
    return sorted(found, key=lambda entry: int(entry.name))


def is_complete(checkpoint: Path) -> bool:
    return all((checkpoint / name).is_file() for name in CHECKPOINT_FILES)


def set_aside_incomplete(folder: Path) -> list[str]:
    """Rename half-written numbered checkpoints (killed while saving) so speculators skips them."""
    moved = []
    for checkpoint in reversed(_numbered(folder)):
        if is_complete(checkpoint):
            break  # only the newest ones can be half-written
        target = checkpoint.with_name(f"{checkpoint.name}.incomplete-{time.strftime('%Y%m%d-%H%M%S')}")
        checkpoint.rename(target)
        moved.append(target.name)
    return moved


def checkpoint_state(folder: Path) -> CheckpointState:
    numbered = [checkpoint for checkpoint in _numbered(folder) if is_complete(checkpoint)]
    newest = numbered[-1] if numbered else None
    state: dict[str, Any] = {}
    if newest is not None:
        try:
            state = json.loads((newest / "training_state.json").read_text())
        except (OSError, ValueError):
            state = {}
    local_step = state.get("local_step") or None
    return CheckpointState(folder, int(newest.name) if newest else None, local_step,
                           state.get("global_step"), (folder / "interrupted").is_dir())


def start_fresh(checkpoints: Path) -> Path | None:
    """--fresh: move a used checkpoints folder aside to checkpoints-<timestamp> (kept, never deleted)."""
    if not checkpoints.is_dir() or not any(checkpoints.iterdir()):
        return None
    while True:
        aside = checkpoints.with_name(f"{checkpoints.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        if not aside.exists():
            break
        time.sleep(1)  # two --fresh within one second
    checkpoints.rename(aside)
    return aside


# --- running ---------------------------------------------------------------------------------

def resolve_executable(name: str) -> str:
    """A console script of this interpreter's environment first (the agent may run without it on PATH)."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name) or name


def run_training(command: list[str], save_path: Path, env: dict[str, str] | None = None, watch: Any = None,
                 guard: Any = None) -> int:
    """Run the trainer; its output goes to our stderr and is appended to save_path/train.log.

    `watch` (training.epochs.EpochWatch) sees each finished epoch while the trainer runs; our stderr then
    gets the trainer's output in whole lines, so the watcher's own lines never cut one of its records.
    `guard` (training.online.Watch, online and hybrid modes) is started with a callable that stops the
    trainer (its server died, or the disk budget was passed) and puts its own lines between the trainer's."""
    save_path.mkdir(parents=True, exist_ok=True)
    argv = [resolve_executable(command[0]), *command[1:]]
    lock = watch.lock if watch is not None else contextlib.nullcontext()
    whole_lines = watch is not None or guard is not None
    with open(save_path / LOG_FILE, "ab") as log:
        log.write(f"### specops launch {time.strftime('%Y-%m-%dT%H:%M:%S')}: {json.dumps(command)}\n".encode())
        log.flush()
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env=train_environment(env), start_new_session=False)
        assert process.stdout is not None
        if watch is not None:
            watch.attach(process)
        if guard is not None:
            guard.trainer_pid = process.pid
            guard.start(lambda: _stop_trainer(process))
        pending = b""
        try:
            for chunk in iter(lambda: process.stdout.read1(65536), b""):  # type: ignore[union-attr]
                log.write(chunk)
                pending += chunk
                cut = pending.rfind(b"\n") + 1 if whole_lines else len(pending)
                # between the trainer's lines, never inside one (the log holds the whole chunk)
                line = guard.pending_line() if guard is not None and cut == len(pending) else None
                if line:
                    log.write(line.encode())
                log.flush()
                with lock:
                    sys.stderr.buffer.write(pending[:cut] + (line.encode() if line else b""))
                    sys.stderr.flush()
                pending = pending[cut:]
        except KeyboardInterrupt:
            process.terminate()  # speculators saves interrupted/ on SIGTERM
        code = process.wait()
        with lock:
            sys.stderr.buffer.write(pending)
            sys.stderr.flush()
        if watch is not None:
            watch.finish()
        return code


STOP_GRACE_S = 15.0


def _stop_trainer(process: subprocess.Popen) -> None:
    """SIGTERM (speculators saves interrupted/), then SIGKILL after a grace: the step must end in bounded time.
    torchrun's workers run in sessions of their own and a worker stuck in a collective ignores SIGTERM; what
    is left of them after the grace is killed too (they hold the output pipe the step reads to its end)."""
    import signal

    from specops.jobs.processes import descendants

    if process.poll() is not None:
        return
    below = descendants(process.pid)  # before any signal: once torchrun is gone they are nobody's children
    process.terminate()
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
    for pid in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
