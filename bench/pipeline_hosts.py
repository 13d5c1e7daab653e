"""Wall time of the tiny pipeline on one host against the same run across two hosts, side by side.

    PYTHONPATH=src:. .venv/bin/python bench/pipeline_hosts.py [--samples 24] [--epochs 1] [--out DIR]

Both go through the real `invoke pipeline` over real sshds on loopback (testing/sshd.py), each
host with a fresh workdir: `--host gpu1` (the engine as one job) and `--hosts gpu1,gpu2` (the same
engine as one job a host, meeting at a rendezvous on gpu1: each extracts its share, the shares go host
to host, one torchrun training over both, evaluated and fetched). The two "hosts" share this machine's
cores, so the ratio shows the overhead of running across hosts (two doctors, the exchange, the
barriers, the two-node training), not a speed-up; on real hosts extraction divides by the host count.
Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root, for testing/

from testing.cli import Cli, write_inventory
from testing.repo import REPO
from testing.sshd import free_port, start_sshd


def runs(root: Path, samples: int, epochs: int) -> Path:
    folder = root / "runs"
    folder.mkdir(parents=True)
    config = yaml.safe_load((REPO / "runs" / "tiny.yaml").read_text())
    config["samples"] = samples
    config["train"]["epochs"] = epochs
    config["regenerate"]["enabled"] = False
    config["evaluate"].update(heldout_prompts=4, max_tokens=16)
    (folder / "bench.yaml").write_text(yaml.safe_dump(config))
    return folder


def inventory(root: Path, servers: list, tag: str) -> Path:
    import sys

    known_hosts = root / "known_hosts"
    known_hosts.write_text("".join(server.known_hosts_line() for server in servers))
    hosts = {name: {"address": "127.0.0.1", "port": server.port, "user": server.user,
                    "identity_file": str(server.client_key), "known_hosts": str(known_hosts),
                    "workdir": str(root / f"{tag}-{name}"), "python": sys.executable, "connect_timeout": 5}
             for name, server in zip(("gpu1", "gpu2"), servers, strict=True)}
    return write_inventory(root / f"inventory-{tag}.yaml", hosts, default="gpu1")


def timed(cli: Cli, env: dict[str, str], *args: str) -> tuple[float, dict]:
    started = time.perf_counter()
    result = cli("pipeline", "--run", "bench", "--json", *args, timeout=3600, **env)
    elapsed = time.perf_counter() - started
    if result.exit_code != 0:
        raise SystemExit(f"pipeline {' '.join(args)} failed ({result.exit_code}): {result.stderr[-3000:]}")
    return elapsed, result.json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="bench-pipeline-hosts-"))
    servers = [start_sshd(root / "sshd-1", clean_login=False), start_sshd(root / "sshd-2", clean_login=False)]
    try:
        env = {"SPECOPS_RUNS_DIR": str(runs(root, args.samples, args.epochs)),
               "SPECOPS_FETCHED": str(root / "fetched")}
        one_s, one = timed(Cli(inventory(root, servers, "one"), root / "logs-one"), env, "--host", "gpu1")
        two_s, two = timed(Cli(inventory(root, servers, "two"), root / "logs-two"), env, "--hosts", "gpu1,gpu2",
                           "--port", str(free_port()))
    finally:
        for server in servers:
            server.stop()
    steps = {name: info.get("seconds") for name, info in two["steps"].items()}
    result = {"samples": args.samples, "epochs": args.epochs, "one_host_s": round(one_s, 1),
              "two_hosts_s": round(two_s, 1), "two_over_one": round(two_s / one_s, 2),
              "one_host_steps": {name: info.get("seconds") for name, info in one["steps"].items()},
              "two_host_steps": steps}
    print(f"tiny pipeline, {args.samples} samples, {args.epochs} epoch(s): one host {one_s:.1f} s | "
          f"two hosts {two_s:.1f} s | ratio {two_s / one_s:.2f}")
    print(f"  one host, by step (s): {result['one_host_steps']}")
    print(f"  two hosts, by step (s): {steps}")
    (root / "bench.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
