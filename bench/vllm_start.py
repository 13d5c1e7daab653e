"""A vLLM CPU server load, side by side: vLLM's default worker process against specops' one-process engine.

    PYTHONPATH=src python bench/vllm_start.py [--n 3] [--serve-python .venv-vllm/bin/python]

On a CPU host specops serves with VLLM_ENABLE_V1_MULTIPROCESSING=0 (specops.pipeline.vllm.command.
one_process_engine): the engine core runs its one worker itself instead of starting a separate worker
process that imports vLLM and torch again. Each round starts the tiny target's extraction server
(the argv specops builds, `--enforce-eager`, a warm vLLM cache) both ways, in turn, waits for
/health, sends one request, and stops it; prints the median seconds to ready, the CPU seconds of all
the server's processes until then, the process count, and the ratios. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> tuple[float, int]:
    """(CPU seconds, process count) of every live process below `root`."""
    children: dict[int, list[tuple[int, float]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        children.setdefault(int(fields[1]), []).append((int(entry.name), (int(fields[11]) + int(fields[12])) / TICK))
    total, count, todo = 0.0, 0, [root]
    while todo:
        for pid, cpu in children.get(todo.pop(), []):
            total, count = total + cpu, count + 1
            todo.append(pid)
    return total, count


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def one_load(argv: list[str], env: dict[str, str], port: int, log: Path) -> dict[str, float]:
    started = time.monotonic()
    with log.open("w") as out:
        server = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    # the server's processes are this process's descendants: its pid is the group leader
    cpu = count = 0.0
    try:
        while True:
            cpu, count = tree_cpu(os.getpid())
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None:
                raise SystemExit(f"the server ended before it was ready; see {log}")
            time.sleep(0.2)
        ready = time.monotonic() - started
        cpu, count = tree_cpu(os.getpid())
        body = b'{"model":"%s","prompt":[1,2,3,4],"max_tokens":8}' % argv[2].encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=120).read()
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    return {"ready_s": ready, "cpu_s": cpu, "processes": count}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--serve-python", type=Path, default=REPO / ".venv-vllm" / "bin" / "python")
    args = parser.parse_args()

    from specops.pipeline.data import tiny
    from specops.pipeline.run import Run
    from specops.pipeline.vllm.command import ENGINE_MULTIPROCESSING, build_serve_command
    from specops.pipeline.vllm.job import CPU_KVCACHE_GIB

    with tempfile.TemporaryDirectory(prefix="vllm-start-") as folder:
        root = Path(folder)
        (root / "runs").mkdir()
        (root / "runs" / "tiny.yaml").write_text((REPO / "runs" / "tiny.yaml").read_text())
        tiny.generate(root)
        os.environ["SPECOPS_WORKDIR"] = str(root)
        os.environ.pop(ENGINE_MULTIPROCESSING, None)
        port = free_port()
        argv, extra = build_serve_command(Run("tiny", root), 0, port, root, serve_python=args.serve_python)
        base = {**os.environ, **extra, "VLLM_CPU_KVCACHE_SPACE": CPU_KVCACHE_GIB}
        ways = {"vLLM default (worker process)": {k: v for k, v in base.items() if k != ENGINE_MULTIPROCESSING},
                "specops (one-process engine)": base}
        one_load(argv, ways["specops (one-process engine)"], port, root / "warm-up.log")  # fills vLLM's cache
        results: dict[str, list[dict[str, float]]] = {name: [] for name in ways}
        for round_number in range(args.n):
            for name, env in ways.items():
                results[name].append(one_load(argv, env, port, root / f"{round_number}.log"))
                print(f"round {round_number + 1} {name}: {results[name][-1]}", file=sys.stderr)
    medians = {name: {key: statistics.median(row[key] for row in rows) for key in rows[0]}
               for name, rows in results.items()}
    print(f"{'':32} {'ready s':>8} {'CPU s':>7} {'processes':>9}")
    for name, row in medians.items():
        print(f"{name:32} {row['ready_s']:8.1f} {row['cpu_s']:7.1f} {row['processes']:9.0f}")
    default, ours = medians.values()
    print(f"specops / default: ready {ours['ready_s'] / default['ready_s']:.2f}, "
          f"CPU {ours['cpu_s'] / default['cpu_s']:.2f} (median of {args.n})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
