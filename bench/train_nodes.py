"""Wall time of the tiny draft's training on one host against the same training as a two-node
torchrun group (gloo, CPU), side by side as a ratio.

    PYTHONPATH=src:. .venv/bin/python bench/train_nodes.py [--epochs 2] [--out DIR]

Both use the same generated inputs (tests/support/tiny_training.py) and speculators 0.9.0 from the
wheel patched by the CPU patch set; the two "hosts" are two workdirs on this machine meeting at a c10d
rendezvous on loopback, so on a 2-core machine the group shares the same cores: the ratio measures the
group's overhead (rendezvous, gloo all-reduce per step), not a speed-up. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from tests.support.repo import REPO
from tests.support.sshd import free_port
from tests.support.tiny_training import TinyHost, build_data
from tests.support.wheels import site_with


def node(root: Path, site: Path, name: str) -> TinyHost:
    host = TinyHost(root / name)
    host.site = site
    build_data(host.workdir / "inputs" / "verifier", host.workdir / "inputs" / "prepared",
               host.workdir / "inputs" / "hidden_states")
    return host


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="bench-train-nodes-"))
    site = site_with(root / "site", ("speculators", "0.9.0"))
    one, first, second = (node(root, site, name) for name in ("one", "node0", "node1"))
    one.agent("patch", "apply", "--set", "speculators-0.9.0-cpu", "--patches-dir", str(REPO / "patches"))
    for host in (one, first, second):
        host.add_run("bench", args.epochs)
        host.agent("step", "vocab", "--run", "bench")

    started = time.perf_counter()
    one.agent("step", "train", "--run", "bench")
    single = time.perf_counter() - started

    endpoint = f"127.0.0.1:{free_port()}"
    started = time.perf_counter()
    group = [host.start_agent("step", "train", "--run", "bench", "--nnodes", "2", "--node-rank", str(rank),
                              "--rdzv-endpoint", endpoint, "--rdzv-id", "bench")
             for rank, host in enumerate((first, second))]
    codes = [process.wait() for process in group]
    pair = time.perf_counter() - started
    result = {"epochs": args.epochs, "one_host_s": round(single, 1), "two_nodes_s": round(pair, 1),
              "two_over_one": round(pair / single, 2), "exit_codes": codes}
    print(f"tiny draft, {args.epochs} epoch(s): one host {single:.1f} s | two-node group {pair:.1f} s | "
          f"ratio {pair / single:.2f} (exit codes {codes})")
    (root / "bench.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
