"""Training-step throughput: speculators' trainer called directly vs specops' launch path.

Both sides train the same draft for the same fixed number of steps on the same synthetic inputs
(Llama-3.1-8B dimensions by default: hidden 4096, vocab 128256, 32 layers, draft vocab 32k, 1 draft
layer, ttt 3, sequences of 2048), and both logs are read with specops' metrics parser. Prints tokens/s
of each side, their ratio (specops overhead should be ~0), and the step time against the GPU's bf16
compute limit.

    PYTHONPATH=src python bench/train_speculators.py                    # on the H200 host
    PYTHONPATH=<patched site>:src python bench/train_speculators.py --tiny --cpu   # smoke test here
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from specops.pipeline.training import command as train
from specops.pipeline.training import metrics, vocab


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
BF16_PEAK_FLOPS = 790e12  # H200 dense bf16, as the issue states it


def make_inputs(shape: Shape, samples: int, root: Path) -> tuple[Path, Path, Path, tuple[int, ...]]:
    """A verifier folder (config + the embedding and LM head speculators loads), data, hidden states."""
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file

    verifier, data, hidden = root / "verifier", root / "data", root / "data" / "hidden_states"
    verifier.mkdir(parents=True)
    hidden.mkdir(parents=True)
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
    layer_ids = (2, shape.layers // 2, shape.layers - 3) if shape.layers > 5 else (1, 2, 3)
    rows: dict[str, list] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    freq: dict[int, int] = {}
    for index in range(samples):
        ids = torch.randint(0, shape.vocab, (shape.seq_len,), generator=generator)
        rows["input_ids"].append(ids.tolist())
        rows["loss_mask"].append([1] * shape.seq_len)
        rows["seq_len"].append(shape.seq_len)
        for token in ids.tolist():
            freq[token] = freq.get(token, 0) + 1
        states = torch.randn(shape.seq_len, len(layer_ids) + 1, shape.hidden, generator=generator)
        save_file({"token_ids": ids, "hidden_states": states.to(torch.bfloat16)},
                  str(hidden / f"hs_{index}.safetensors"))
    dataset = Dataset.from_dict(rows)
    dataset.set_format(type="torch")
    dataset.save_to_disk(str(data))
    torch.save(freq, data / "token_freq.pt")
    return verifier, data, hidden, layer_ids


def train_flops_per_token(shape: Shape, ttt_steps: int) -> float:
    """Matmul FLOPs of one training token: forward x3 for forward + backward of the draft, plus the
    verifier LM head (forward only) that makes the targets. Attention scores are counted causal."""
    h, kv = shape.hidden, shape.hidden * shape.kv_heads // shape.heads
    fc = 2 * 3 * h * h
    # EAGLE-3's draft layer projects q/k/v from [embedding, hidden] (2h wide)
    layer = 2 * (2 * h) * (h + 2 * kv) + 2 * h * h + 3 * 2 * h * shape.intermediate
    attention = 2 * 2 * h * shape.seq_len / 2
    head = 2 * h * shape.draft_vocab
    draft = fc + ttt_steps * (layer + attention + head)
    return 3 * draft + 2 * h * shape.vocab


def run_side(label: str, command: list[str], save: Path, through_specops: bool, env: dict[str, str]) -> float:
    started = time.monotonic()
    if through_specops:
        code = train.run_training(command, save, env)
    else:  # the user's way: the console script, output straight to a file
        save.mkdir(parents=True, exist_ok=True)
        with open(save / train.LOG_FILE, "wb") as log:
            code = subprocess.run([train.resolve_executable(command[0]), *command[1:]], stdout=log,
                                  stderr=subprocess.STDOUT, env=train.train_environment(env)).returncode
    if code != 0:
        sys.exit(f"{label}: trainer exited with {code}; see {save / train.LOG_FILE}")
    return time.monotonic() - started


def warm_speeds(log_path: Path, warmup: int) -> tuple[float, float]:
    steps = metrics.read_log(log_path).steps[warmup:]
    speeds = [step.profile["tokens_per_s"] for step in steps if "tokens_per_s" in step.profile]
    times = [step.profile["step_ms"] for step in steps if "step_ms" in step.profile]
    if not speeds:
        sys.exit(f"no step metrics in {log_path}")
    return statistics.median(speeds), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny dimensions (smoke test)")
    parser.add_argument("--cpu", action="store_true", help="no GPU: eager loss, sdpa (needs the CPU patch set)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per side (default 40, tiny 8)")
    parser.add_argument("--warmup", type=int, default=None, help="steps left out of the median (default 5, tiny 2)")
    parser.add_argument("--loss", choices=["fused", "eager"], default=None, help="default: fused on GPU")
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--workdir", type=Path, default=None, help="keep inputs and logs here")
    args = parser.parse_args()
    shape = TINY if args.tiny else EIGHT_B
    if args.seq_len:
        shape = Shape(**{**shape.__dict__, "seq_len": args.seq_len})
    steps = args.steps or (8 if args.tiny else 40)
    warmup = args.warmup if args.warmup is not None else (2 if args.tiny else 5)
    root = args.workdir or Path(tempfile.mkdtemp(prefix="bench-train-"))
    print(f"inputs in {root}", file=sys.stderr)
    verifier, data, hidden, layer_ids = make_inputs(shape, steps + 2, root / "inputs")
    vocab_out = vocab.build_vocab(data / "token_freq.pt", shape.draft_vocab, shape.vocab, root / "vocab")
    gpus = 0 if args.cpu else 1
    ttt = 3
    env = dict(os.environ)
    results = {}
    for label, through_specops in (("speculators", False), ("specops", True)):
        plan = train.TrainPlan(
            verifier=str(verifier), data_path=data, hidden_states_path=hidden, save_path=root / label,
            target_layer_ids=layer_ids, draft_vocab_size=shape.draft_vocab, d2t_path=Path(vocab_out["d2t"]),
            t2d_path=Path(vocab_out["t2d"]), ttt_steps=ttt, epochs=1, lr=1e-4,
            loss_implementation=args.loss or "auto", total_seq_len=shape.seq_len,
            extra_args=("--max-steps", str(steps), "--mask-token-id", "0", "--train-data-ratio", "0.95",
                        "--num-workers", "0" if args.cpu else "4", "--log-freq", "1"),
        )
        command = train.build_train_command(plan, gpus)
        wall = run_side(label, command, plan.save_path, through_specops, env)
        results[label] = (*warm_speeds(plan.save_path / train.LOG_FILE, warmup), wall)
        print(f"{label:>12}: {results[label][0]:12.0f} tokens/s  step {results[label][1]:9.1f} ms  "
              f"(wall {wall:.0f} s for {steps} steps)", file=sys.stderr)
    direct, ours = results["speculators"], results["specops"]
    flops = train_flops_per_token(shape, ttt) * shape.seq_len
    ideal_ms = flops / BF16_PEAK_FLOPS * 1000
    print(f"\nsetting: hidden {shape.hidden}, vocab {shape.vocab}, draft vocab {shape.draft_vocab}, 1 draft layer, "
          f"ttt {ttt}, seq {shape.seq_len}, {steps} steps ({warmup} warm-up left out)")
    print(f"{'side':>12} {'tokens/s':>12} {'step ms':>10}")
    print(f"{'speculators':>12} {direct[0]:12.0f} {direct[1]:10.1f}")
    print(f"{'specops':>12} {ours[0]:12.0f} {ours[1]:10.1f}")
    print(f"ratio specops/speculators tokens/s: {ours[0] / direct[0]:.3f}")
    print(f"compute limit: ~{flops / 1e12:.2f} TFLOP per step -> {ideal_ms:.2f} ms at 790 TFLOP/s bf16; "
          f"measured {direct[1]:.1f} ms = {100 * ideal_ms / direct[1]:.1f}% of peak")


if __name__ == "__main__":
    main()
