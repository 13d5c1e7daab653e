"""What the training benches share: synthetic inputs laid out as a specops run, the two ways of
starting `speculators train` (the user's own command line, and specops' job launch of `step train`),
a clock that stamps each logged step as it reaches the log, and the step's compute limit.

Throughput is read off the wall clock between logged steps, not off speculators' per-step
`profile/tokens_per_s`: with `--log-freq N > 1` a logged step's timer starts unsynchronized at the
end of the previous (unlogged) step, so its figure absorbs whatever GPU backlog that step left.
Each logged record is printed right after a full synchronize, so the time between the records of
steps a and b is the true time of b - a steps.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # the bench runs from a checkout, specops need not be installed
    sys.path.insert(0, str(REPO / "src"))
GLOBAL_STEP = re.compile(r"(?<![\w/])global_step=(\d+)")
BF16_PEAK_FLOPS = 790e12  # H200 dense bf16 (measured 769-798 TFLOP/s on this kind)
HBM_BYTES_PER_S = 4.3e12  # H200 device copy, read + written, as measured on this kind
RUN = "bench"
# whether run configs have train.optimizer / log_freq / loader_workers (else extra_args carries them)
CONFIG_FIELDS = True


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    draft_vocab: int
    seq_len: int


EIGHT_B = Shape(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, vocab=128256,
                draft_vocab=32000, seq_len=2048)
TINY = Shape(hidden=64, intermediate=128, layers=4, heads=2, kv_heads=2, vocab=512, draft_vocab=256, seq_len=64)


# --- inputs ----------------------------------------------------------------------------------------

def make_run_inputs(shape: Shape, rows: int, workdir: Path, distinct: int = 8) -> Path:
    """runs/bench/{prepared,hidden_states,vocab} and a verifier folder under `workdir`.

    Only `distinct` different samples are generated; the other rows repeat them (dataset rows and
    hard-linked hidden-state files alike), so 300 rows of 8B hidden states cost 0.5 GB, not 20 GB.
    The verifier is a config plus the embedding and LM head, all speculators loads from it.
    """
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file

    from specops.pipeline.training import vocab

    run_dir = workdir / "runs" / RUN
    verifier, data, hidden = workdir / "verifier", run_dir / "prepared", run_dir / "hidden_states"
    for folder in (verifier, data, hidden):
        folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": shape.hidden,
              "intermediate_size": shape.intermediate, "num_hidden_layers": shape.layers,
              "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
              "vocab_size": shape.vocab, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
              "hidden_act": "silu", "rope_theta": 500000.0, "bos_token_id": 1, "eos_token_id": 2,
              "initializer_range": 0.02, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    (verifier / "config.json").write_text(json.dumps(config))
    generator = torch.Generator().manual_seed(0)
    weights = {name: (torch.randn(shape.vocab, shape.hidden, generator=generator) * 0.02).to(torch.bfloat16)
               for name in ("model.embed_tokens.weight", "lm_head.weight")}
    save_file(weights, str(verifier / "model.safetensors"))
    captured = 4  # three auxiliary layers and the final one (the run's derived layer ids)
    distinct = min(distinct, rows)
    samples = []
    for index in range(distinct):
        ids = torch.randint(0, shape.vocab, (shape.seq_len,), generator=generator)
        states = torch.randn(shape.seq_len, captured, shape.hidden, generator=generator).to(torch.bfloat16)
        save_file({"token_ids": ids, "hidden_states": states}, str(hidden / f"hs_{index}.safetensors"))
        samples.append(ids.tolist())
    freq: dict[int, int] = {}
    for row in range(rows):
        if row >= distinct:
            os.link(hidden / f"hs_{row % distinct}.safetensors", hidden / f"hs_{row}.safetensors")
        for token in samples[row % distinct]:
            freq[token] = freq.get(token, 0) + 1
    dataset = Dataset.from_dict({"input_ids": [samples[row % distinct] for row in range(rows)],
                                 "loss_mask": [[1] * shape.seq_len] * rows, "seq_len": [shape.seq_len] * rows})
    dataset.set_format(type="torch")
    dataset.save_to_disk(str(data))
    torch.save(freq, data / "token_freq.pt")
    vocab.build_vocab(data / "token_freq.pt", shape.draft_vocab, shape.vocab, run_dir / "vocab")
    return verifier


@dataclass(frozen=True)
class Variant:
    """One training setting of the bench: what goes into the run config's `train` section."""

    optimizer: str
    tokens_per_step: int
    steps: int
    log_freq: int = 10
    workers: int | None = None  # None: speculators' default (12)
    extra: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        return f"{self.optimizer}-{self.tokens_per_step}"


def write_run_config(workdir: Path, verifier: Path, shape: Shape, variant: Variant) -> Path:
    """runs/bench.yaml for one variant (the settings a user would write)."""
    import yaml

    extra = ["--max-steps", str(variant.steps), "--mask-token-id", "0", "--train-data-ratio", "0.95"]
    train: dict = {"epochs": 1, "lr": 1e-4, "total_seq_len": variant.tokens_per_step}
    if CONFIG_FIELDS:
        train.update(optimizer=variant.optimizer, log_freq=variant.log_freq)
        if variant.workers is not None:
            train["loader_workers"] = variant.workers
    else:  # a run config without those fields: the same flags through extra_args
        extra += ["--optimizer", variant.optimizer, "--log-freq", str(variant.log_freq)]
        if variant.workers is not None:
            extra += ["--num-workers", str(variant.workers)]
    train["extra_args"] = [*extra, *variant.extra]
    config = {"model": str(verifier), "data": "synthetic (bench)", "draft": {"vocab_size": shape.draft_vocab},
              "train": train}
    path = workdir / "runs" / f"{RUN}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# --- running ---------------------------------------------------------------------------------------

class LogClock:
    """Stamps the moment each `global_step=N` first appears, complete, in a growing log file."""

    def __init__(self, path: Path, started: float) -> None:
        self.path, self.offset, self.partial, self.started = path, 0, "", started
        self.stamps: dict[int, float] = {}  # seconds since `started`

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as log:
                log.seek(self.offset)
                chunk = log.read()
        except FileNotFoundError:
            return
        if not chunk:
            return
        now = time.perf_counter() - self.started
        self.offset += len(chunk)
        lines = (self.partial + chunk.decode(errors="replace")).split("\n")
        self.partial = lines.pop()  # an unfinished line waits for its newline
        for line in lines:
            for match in GLOBAL_STEP.finditer(line):
                self.stamps.setdefault(int(match.group(1)), now)


def agent(env: dict[str, str], *args: str) -> dict:
    """One `python -m specops ...` call, as the control side makes it on the host."""
    result = subprocess.run([sys.executable, "-m", "specops", *args], env=env, capture_output=True, text=True,
                            cwd=env["SPECOPS_WORKDIR"])
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        sys.exit(f"specops {' '.join(args)} exited {result.returncode}: {result.stdout[-2000:]}{result.stderr[-3000:]}")
    return json.loads(lines[-1])


def bench_env(workdir: Path) -> dict[str, str]:
    path = [part for part in os.environ.get("PYTHONPATH", "").split(os.pathsep) if part]
    return {**os.environ, "SPECOPS_WORKDIR": str(workdir), "PYTHONPATH": os.pathsep.join([*path, str(REPO / "src")]),
            "COLUMNS": "240", "PYTHONUNBUFFERED": "1"}


@dataclass
class SideResult:
    label: str
    wall_s: float
    stamps: dict[int, float]
    log: Path
    exit_code: int


def run_direct(env: dict[str, str], argv: list[str], save: Path, poll_s: float = 0.005) -> SideResult:
    """The user's way: the console script with the same arguments, output redirected to a file."""
    from specops.pipeline.training import command as train

    save.mkdir(parents=True, exist_ok=True)
    log_path = save / "direct.log"
    started = time.perf_counter()
    clock = LogClock(log_path, started)
    with open(log_path, "wb") as log:
        process = subprocess.Popen([train.resolve_executable(argv[0]), *argv[1:]], stdout=log,
                                   stderr=subprocess.STDOUT, env=env, cwd=env["SPECOPS_WORKDIR"])
        while process.poll() is None:
            clock.poll()
            time.sleep(poll_s)
    clock.poll()
    return SideResult("speculators", time.perf_counter() - started, clock.stamps, log_path, process.returncode)


def run_job(env: dict[str, str], step_args: list[str], poll_s: float = 0.005) -> SideResult:
    """specops' way: `job launch` (record, tmux, wrapper) of `python -m specops step train ...`,
    its log followed as `invoke logs` follows it."""
    from specops.jobs import records

    started = time.perf_counter()
    launched = agent(env, "job", "launch", "--name", "train", "--run", RUN, "--",
                     sys.executable, "-m", "specops", *step_args)
    job = launched["job"]
    clock = LogClock(Path(job["log"]), started)
    previous = os.environ.get("SPECOPS_WORKDIR")
    os.environ["SPECOPS_WORKDIR"] = env["SPECOPS_WORKDIR"]
    try:
        next_check = 0.0
        while True:
            clock.poll()
            now = time.perf_counter()
            if now >= next_check:
                record = records.load(job["id"])
                if record["state"] not in ("pending", "running"):
                    break
                next_check = now + 0.5
            time.sleep(poll_s)
    finally:
        if previous is None:
            os.environ.pop("SPECOPS_WORKDIR", None)
        else:
            os.environ["SPECOPS_WORKDIR"] = previous
    clock.poll()
    return SideResult("specops", time.perf_counter() - started, clock.stamps, Path(job["log"]),
                      int(record.get("exit_code") or 0) if record["state"] == "succeeded" else 1)


def window_rate(result: SideResult, warmup: int) -> tuple[float, int, int]:
    """(steps per second, first step, last step) between the first logged step >= warmup and the last."""
    steps = sorted(step for step in result.stamps if step >= warmup)
    if len(steps) < 2:
        sys.exit(f"{result.label}: fewer than two logged steps after step {warmup}; see {result.log}")
    first, last = steps[0], steps[-1]
    return (last - first) / (result.stamps[last] - result.stamps[first]), first, last


def tokens_per_step(*logs: Path) -> float:
    """Tokens of one packed batch, as speculators counts them (its profile: tokens/s x step time)."""
    import statistics

    from specops.pipeline.training import metrics

    counts = [step.profile["tokens_per_s"] * step.profile["step_ms"] / 1000
              for log in logs for step in metrics.read_log(log).steps if "tokens_per_s" in step.profile]
    if not counts:
        sys.exit(f"no step metrics in {', '.join(map(str, logs))}")
    return statistics.median(counts)


# --- the compute limit -----------------------------------------------------------------------------

def draft_matrices(shape: Shape) -> dict[str, tuple[int, int]]:
    """The draft's trainable 2-D weights (out, in): EAGLE-3's fc, one decoder layer, the LM head."""
    h, kv = shape.hidden, shape.hidden * shape.kv_heads // shape.heads
    return {"fc": (h, 3 * h), "q_proj": (h, 2 * h), "k_proj": (kv, 2 * h), "v_proj": (kv, 2 * h),
            "o_proj": (h, h), "gate_proj": (shape.intermediate, h), "up_proj": (shape.intermediate, h),
            "down_proj": (h, shape.intermediate), "lm_head": (shape.draft_vocab, h)}


def train_flops_per_token(shape: Shape, ttt_steps: int) -> float:
    """Matmul FLOPs of one training token: forward x3 for forward + backward of the draft, plus the
    verifier LM head (forward only) that makes the targets. Attention scores are counted causal
    within a document of `seq_len` tokens (packed documents do not attend to each other)."""
    h, kv = shape.hidden, shape.hidden * shape.kv_heads // shape.heads
    fc = 2 * 3 * h * h
    layer = 2 * (2 * h) * (h + 2 * kv) + 2 * h * h + 3 * 2 * h * shape.intermediate
    attention = 2 * 2 * h * shape.seq_len / 2
    head = 2 * h * shape.draft_vocab
    draft = fc + ttt_steps * (layer + attention + head)
    return 3 * draft + 2 * h * shape.vocab


def newton_schulz_flops(shape: Shape, ns_steps: int = 5) -> float:
    """Muon's work per optimizer step, whatever the batch: per matrix (m <= n) and iteration,
    A = X Xᵀ (2m²n), B = bA + cA² (2m³), X = aX + BX (2m²n). The LM head goes to AdamW."""
    total = 0.0
    for name, (rows, cols) in draft_matrices(shape).items():
        if name == "lm_head":
            continue
        m, n = min(rows, cols), max(rows, cols)
        total += ns_steps * (4 * m * m * n + 2 * m ** 3)
    return total


def adamw_bytes(shape: Shape, optimizer: str) -> float:
    """HBM traffic of the AdamW update (fp32 param, grad, two moments read; param, moments written)."""
    matrices = draft_matrices(shape)
    params = sum(rows * cols for name, (rows, cols) in matrices.items() if optimizer == "adamw" or name == "lm_head")
    return 28.0 * params


@dataclass(frozen=True)
class Limit:
    model_tflop: float
    optimizer_tflop: float
    optimizer_gb: float
    ms: float


def step_limit(shape: Shape, variant: Variant, ttt_steps: int, peak: float = BF16_PEAK_FLOPS) -> Limit:
    model = train_flops_per_token(shape, ttt_steps) * variant.tokens_per_step
    optimizer = newton_schulz_flops(shape) if variant.optimizer == "muon" else 0.0
    traffic = adamw_bytes(shape, variant.optimizer)
    ms = ((model + optimizer) / peak + traffic / HBM_BYTES_PER_S) * 1000
    return Limit(model / 1e12, optimizer / 1e12, traffic / 1e9, ms)
