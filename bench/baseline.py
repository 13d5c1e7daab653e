"""The speedup's baseline, interleaved: the target alone on the extraction server against a dedicated one.

    PYTHONPATH=src python bench/baseline.py --workdir WD --run R [--rounds 4]

Evaluate's speedup divides the draft-speculating server's tokens/s by the target alone's; since issue 34
the target alone is measured on the run's extraction server during extract (vllm.baseline), no load of
its own. That server also runs vLLM's `extract_hidden_states` method and writes each request's prompt
hidden states. This starts both servers side by side (the extraction server as specops builds it, and a
plain target-alone server, each on a port of its own) and sends evaluate's held-out prompts at evaluate's
settings (token ids, one at a time, greedy, evaluate.max_tokens), the two servers in turn, `--rounds`
times each after one warm-up round, so the machine's load hits both alike. Prints tokens/s per round,
the medians and their ratio. WD must hold a run whose prepare has run (its held-out prompts) and the
serve env in SPECOPS_SERVE_PYTHON (default .venv-vllm). Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--run", required=True)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    os.environ["SPECOPS_WORKDIR"] = str(args.workdir)
    os.environ.setdefault("SPECOPS_SERVE_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from specops.pipeline.evaluation.prompts import heldout_token_ids
    from specops.pipeline.evaluation.served import run_prompts
    from specops.pipeline.run import Run
    from specops.pipeline.vllm import Discarded, build_serve_command, serve_env, staging_dir, start_server, stop_server
    from specops.pipeline.vllm.generation import build_generate_command
    from specops.pipeline.vllm.readiness import wait_ready

    run = Run(args.run, args.workdir)
    python, version = serve_env()
    prompts = heldout_token_ids(run, None)
    max_tokens = run.config.evaluate.max_tokens
    ports = {"extraction server": free_port(), "dedicated target alone": free_port()}
    commands = {"extraction server": build_serve_command(run, 0, ports["extraction server"], args.workdir,
                                                         serve_python=python, vllm_version=version),
                "dedicated target alone": build_generate_command(run, 0, ports["dedicated target alone"], python,
                                                                 version)}
    logs = args.workdir / "logs"
    processes = {}
    try:
        for name, (argv, env) in commands.items():  # one at a time: two loads at once on 2 cores starve both
            processes[name] = start_server(argv, env, logs / f"bench-baseline-{ports[name]}.log")
            ready = wait_ready(ports[name], processes[name].pid, log=logs / f"bench-baseline-{ports[name]}.log",
                               timeout_s=900, progress=lambda _line: None)
            if not ready["ok"]:
                raise SystemExit(f"{name}: {ready['error']}")
        models = {name: str(run.model_path) for name in ports}
        rates: dict[str, list[float]] = {name: [] for name in ports}
        with Discarded(staging_dir(run)):
            for round_ in range(args.rounds + 1):
                for name, port in ports.items():
                    rate = run_prompts(f"http://127.0.0.1:{port}", models[name], prompts, max_tokens, 3,
                                       speculative=False)["tokens_per_s"]
                    if round_:  # the first round warms both up
                        rates[name].append(rate)
                print(f"round {round_}{' (warm-up)' if not round_ else ''}: " + ", ".join(
                    f"{name} {rates[name][-1] if round_ else rate}" for name in ports), flush=True)
    finally:
        for process in processes.values():
            stop_server(process.pid)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\n{len(prompts)} held-out prompts, {max_tokens} tokens each, vLLM {version}, {args.rounds} rounds after "
          "a warm-up, the servers in turn")
    for name, value in medians.items():
        print(f"{name:24} median {value:8.2f} tokens/s  ({', '.join(f'{rate:.1f}' for rate in rates[name])})")
    ratio = medians["extraction server"] / medians["dedicated target alone"]
    print(f"extraction server / dedicated: {ratio:.3f} (a speedup against the extraction server's rate reads "
          f"{1 / ratio:.3f}x the one against a dedicated server)")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    main()
