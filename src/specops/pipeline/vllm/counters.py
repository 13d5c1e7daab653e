"""A server's request counters from its Prometheus /metrics: how many requests it finished and how
many it holds now (summed over engines and labels). The online training's watch samples them to say
how fast the server serves hidden states and whether it is busy."""

from __future__ import annotations

import urllib.error
import urllib.request

FINISHED = "vllm:request_success_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


def parse(text: str) -> dict[str, float]:
    totals = {"finished": 0.0, "running": 0.0, "waiting": 0.0}
    names = {FINISHED: "finished", RUNNING: "running", WAITING: "waiting"}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                totals[names[name]] += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return totals


def request_counters(port: int, timeout_s: float = 5.0, address: str = "127.0.0.1") -> dict[str, float] | None:
    """The counters of the server on address:port (another host's in a role split), None when it does not
    answer."""
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=timeout_s) as response:
            return parse(response.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError, ValueError):
        return None
